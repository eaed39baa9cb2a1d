"""Weight-only quantization: packed layouts, quantized modules, GGUF and safetensors conversion."""

from localpaged.quant.layout import PackedWeight, cat_rows, quantize_int4, quantize_int8

QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4")

__all__ = ["PackedWeight", "QUANTIZATION_CHOICES", "cat_rows", "quantize_int4", "quantize_int8"]
