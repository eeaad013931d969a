// The vector layer shared by moespec's compiled kernels (experts.cpp, linear.cpp): bfloat16
// conversions, one lane width L per build (AVX-512 or AVX2 + FMA, float32 accumulators), and the
// policies that meet a weight vector with an input vector (widening, or AVX512_BF16 dot products).
// Included inside each file's anonymous namespace, after <immintrin.h> and <cstring>.
#pragma once

using bf16 = uint16_t;

inline float to_f(float v) { return v; }
inline float to_f(bf16 v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <class T> inline T from_f(float v);
template <> inline float from_f<float>(float v) { return v; }
template <> inline bf16 from_f<bf16>(float v) {  // round to nearest even, as torch's .to(bfloat16)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16(0x7fc0);
  return bf16((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---- the vector layer: one lane width L per build; float32 accumulators ----
#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
constexpr int L = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float v) { return _mm512_set1_ps(v); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vload(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
constexpr int L = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float v) { return _mm256_set1_ps(v); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vload(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline float vsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
#error "moespec's compiled kernels need AVX2 + FMA or AVX-512"
#endif

// ---- policies: how a weight vector meets an input vector ----
template <class W>
struct Widen {  // float32 or bfloat16 weights widened to float32, float32 tokens
  using w_t = W;
  using x_t = float;
  using wv = vf;
  using xv = vf;
  static constexpr int step = L;
  static wv loadw(const w_t* p) { return vload(p); }
  static xv loadx(const x_t* p) { return vload(p); }
  static vf madd(vf acc, wv w, xv x) { return vfma(w, x, acc); }
};
using F32 = Widen<float>;
using BF16 = Widen<bf16>;
#if defined(__AVX512BF16__)
constexpr bool kDpbf16 = true;
struct BF16DP {  // bfloat16 weights and tokens, pairwise dot products into float32 (vdpbf16ps)
  using w_t = bf16;
  using x_t = bf16;
  using wv = __m512bh;
  using xv = __m512bh;
  static constexpr int step = 32;
  static wv loadw(const w_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static xv loadx(const x_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static vf madd(vf acc, wv w, xv x) { return _mm512_dpbf16_ps(acc, w, x); }
};
#else
constexpr bool kDpbf16 = false;
#endif
