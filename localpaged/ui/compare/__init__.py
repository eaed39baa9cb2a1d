"""The compare tab: one prompt answered in 2 to 4 columns decoded in one engine batch (samples,
per-column settings, or the beams of one beam search); one column becomes the branch."""
