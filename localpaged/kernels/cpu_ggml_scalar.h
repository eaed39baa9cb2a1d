// Part of kernels/cpu_ggml.cpp, which includes it inside its anonymous namespace (after Acts and TileFn):
// the plain C++ tiles, every format, for CPUs without AVX2.
#pragma once

// ---------------------------------------------------------------------------------------------
// Plain C++: each block unpacked to integers, then one integer dot per row.

// A K block: w[k] = d * sc[k / 16] * q[k] - dmin * mn[k / 16].
struct KInts {
  int8_t q[kSuper];
  int32_t sc[16], mn[16];
  float d, dmin;
};

// A 32-element block: w[k] = d * q[k] + m.
struct BInts {
  int8_t q[32];
  float d, m;
};

// Q4_K / Q5_K: 8 six-bit scales and mins in 12 bytes.
void k4_scale_min(const uint8_t* s, int j, int32_t& sc, int32_t& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void unpack_q4_k(const uint8_t* p, KInts& u) {
  u.d = half(p);
  u.dmin = half(p + 2);
  for (int j = 0; j < 8; ++j) {
    k4_scale_min(p + 4, j, u.sc[2 * j], u.mn[2 * j]);
    u.sc[2 * j + 1] = u.sc[2 * j];
    u.mn[2 * j + 1] = u.mn[2 * j];
  }
  const uint8_t* qs = p + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      u.q[64 * c + l] = qs[32 * c + l] & 0xF;
      u.q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
}

void unpack_q5_k(const uint8_t* p, KInts& u) {
  unpack_q4_k(p, u);   // same header, scales and nibble order; the qs lie 32 bytes later
  const uint8_t *qh = p + 16, *qs = p + 48;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      u.q[64 * c + l] = (qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
      u.q[64 * c + 32 + l] = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
    }
}

void unpack_q6_k(const uint8_t* p, KInts& u) {
  const uint8_t *ql = p, *qh = p + 128;
  for (int i = 0; i < 16; ++i) {
    u.sc[i] = static_cast<int8_t>(p[192 + i]);
    u.mn[i] = 0;
  }
  u.d = half(p + 208);
  u.dmin = 0.0f;
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int hb = qh[32 * h + l];
      int8_t* q = u.q + 128 * h;
      q[l] = static_cast<int8_t>(((ql[64 * h + l] & 0xF) | ((hb & 3) << 4)) - 32);
      q[l + 32] = static_cast<int8_t>(((ql[64 * h + l + 32] & 0xF) | (((hb >> 2) & 3) << 4)) - 32);
      q[l + 64] = static_cast<int8_t>(((ql[64 * h + l] >> 4) | (((hb >> 4) & 3) << 4)) - 32);
      q[l + 96] = static_cast<int8_t>(((ql[64 * h + l + 32] >> 4) | (((hb >> 6) & 3) << 4)) - 32);
    }
}

void unpack_q2_k(const uint8_t* p, KInts& u) {
  for (int i = 0; i < 16; ++i) {
    u.sc[i] = p[i] & 0xF;
    u.mn[i] = p[i] >> 4;
  }
  const uint8_t* qs = p + 16;
  u.d = half(p + 80);
  u.dmin = half(p + 82);
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) u.q[128 * h + 32 * s + l] = (qs[32 * h + l] >> (2 * s)) & 3;
}

// Q3_K: 16 six-bit signed scales in 12 bytes (low 4 bits in bytes 0-7, high 2 in bytes 8-11).
int32_t q3_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

void unpack_q3_k(const uint8_t* p, KInts& u) {
  const uint8_t *hmask = p, *qs = p + 32;
  for (int i = 0; i < 16; ++i) {
    u.sc[i] = q3_scale(p + 96, i);
    u.mn[i] = 0;
  }
  u.d = half(p + 108);
  u.dmin = 0.0f;
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int low = (qs[32 * h + l] >> (2 * s)) & 3, high = (hmask[l] >> (4 * h + s)) & 1;
        u.q[128 * h + 32 * s + l] = static_cast<int8_t>(low - (high ? 0 : 4));
      }
}

void unpack_iq4_xs(const uint8_t* p, KInts& u) {
  u.d = half(p);
  u.dmin = 0.0f;
  const uint16_t sh = u16(p + 2);
  const uint8_t *sl = p + 4, *qs = p + 8;
  for (int j = 0; j < 8; ++j) {
    const int ls = ((sl[j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
    u.sc[2 * j] = u.sc[2 * j + 1] = ls - 32;
    u.mn[2 * j] = u.mn[2 * j + 1] = 0;
    for (int l = 0; l < 16; ++l) {
      u.q[32 * j + l] = kIQ4Values[qs[16 * j + l] & 0xF];
      u.q[32 * j + 16 + l] = kIQ4Values[qs[16 * j + l] >> 4];
    }
  }
}

// 32-element blocks: element j < 16 is the low nibble of qs[j], element j + 16 its high nibble.
void nibbles(const uint8_t* qs, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0xF;
    q[j + 16] = qs[j] >> 4;
  }
}

void unpack_q4_0(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  nibbles(p + 2, u.q);
  for (int j = 0; j < 32; ++j) u.q[j] -= 8;
}

void unpack_q4_1(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = half(p + 2);
  nibbles(p + 4, u.q);
}

void fifth_bits(uint32_t qh, int8_t* q) {
  for (int j = 0; j < 32; ++j) q[j] |= ((qh >> j) & 1) << 4;
}

void unpack_q5_0(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  nibbles(p + 6, u.q);
  fifth_bits(u32(p + 2), u.q);
  for (int j = 0; j < 32; ++j) u.q[j] -= 16;
}

void unpack_q5_1(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = half(p + 2);
  nibbles(p + 8, u.q);
  fifth_bits(u32(p + 4), u.q);
}

void unpack_q8_0(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  std::memcpy(u.q, p + 2, 32);
}

void unpack_iq4_nl(const uint8_t* p, BInts& u) {
  u.d = half(p);
  u.m = 0.0f;
  nibbles(p + 2, u.q);
  for (int j = 0; j < 32; ++j) u.q[j] = kIQ4Values[static_cast<uint8_t>(u.q[j])];
}

template <void (*Unpack)(const uint8_t*, KInts&), int64_t Bytes>
void scalar_k_tile(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y, int64_t ldy) {
  float acc[kScalarTileRows] = {};
  KInts u;
  const int64_t K = a.K;
  for (int64_t b = 0; b < a.blocks; ++b) {
    Unpack(row + b * Bytes, u);
    for (int64_t m = 0; m < tm; ++m) {
      const int64_t r = m0 + m;
      const int8_t* x = a.q.data() + r * K + b * kSuper;
      const int16_t* s16 = a.sum16.data() + r * K / 16 + b * 16;
      int32_t sumi = 0, summ = 0;
      for (int i = 0; i < 16; ++i) {
        int32_t s = 0;
        for (int k = 0; k < 16; ++k) s += int32_t(u.q[16 * i + k]) * x[16 * i + k];
        sumi += u.sc[i] * s;
        summ += u.mn[i] * s16[i];
      }
      const float da = a.d[r * a.blocks + b];
      acc[m] = std::fma(u.d * da, static_cast<float>(sumi), acc[m]);
      acc[m] = std::fma(-u.dmin * da, static_cast<float>(summ), acc[m]);
    }
  }
  for (int64_t m = 0; m < tm; ++m) y[m * ldy] = acc[m];
}

template <void (*Unpack)(const uint8_t*, BInts&), int64_t Bytes>
void scalar_b_tile(const uint8_t* row, const Acts& a, int64_t m0, int64_t tm, float* y, int64_t ldy) {
  float acc[kScalarTileRows] = {};
  BInts u;
  const int64_t K = a.K;
  for (int64_t b = 0; b < a.blocks; ++b) {
    Unpack(row + b * Bytes, u);
    for (int64_t m = 0; m < tm; ++m) {
      const int64_t r = m0 + m;
      const int8_t* x = a.q.data() + r * K + b * 32;
      int32_t sumi = 0;
      for (int k = 0; k < 32; ++k) sumi += int32_t(u.q[k]) * x[k];
      acc[m] = std::fma(u.d * a.d[r * a.blocks + b], static_cast<float>(sumi), acc[m]);
      acc[m] = std::fma(u.m, a.dsum32[r * a.blocks + b], acc[m]);
    }
  }
  for (int64_t m = 0; m < tm; ++m) y[m * ldy] = acc[m];
}
