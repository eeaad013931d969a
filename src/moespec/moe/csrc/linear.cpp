// Compiled small-n dense layers of moespec (the why is in moespec/moe/dense.py).
//
// y = x W^T + b for the few rows of a decode or verify pass. Each thread owns a contiguous range of
// the weight's output rows: it streams a block of RT rows from memory once, and meets every input
// row with it while the block is still in L1/L2, so every weight byte is read from memory once per
// call, by one thread, and the threads meet only at the end of the call.
//
// Built once per ISA by moespec.moe.compiled.build_extension (the -m flags and -DMOESPEC_OPS=<op
// namespace>): AVX-512 with AVX512_BF16 dot products, AVX-512 alone, or AVX2 + FMA.
//
// Shapes: n input rows, C in features, R out features (the weight's rows).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef MOESPEC_OPS
#error "build with -DMOESPEC_OPS=<op namespace>"
#endif

namespace {

#include "simd.h"

#if defined(__AVX512F__)
constexpr int RT = 4, TT = 4;  // tile: 4 rows x 4 input rows = 16 of 32 zmm registers
#else
constexpr int RT = 2, TT = 4;  // 8 accumulators + 2 weights + 1 input of 16 ymm registers
#endif

struct Problem {
  int64_t n, C, R;
};

// out[t0 + k, r0 + i] = W[r0 + i] . x[t0 + k] + b[r0 + i] for a tile of R_ weight rows x K input rows.
template <class P, int R_, int K, class O>
inline void tile(const Problem& pb, const typename P::w_t* W, const typename P::w_t* b, const typename P::x_t* x,
                 int64_t r0, int64_t t0, O* out) {
  const int64_t C = pb.C;
  vf acc[R_][K];
#pragma GCC unroll 16
  for (int i = 0; i < R_ * K; ++i) acc[i / K][i % K] = vzero();
  const int64_t Cv = C - C % P::step;
  // While the block meets the input rows, the next block streams into L2 by software prefetch: the
  // memory sees one sequential stream per thread, not R_ short ones. One tile (n <= TT) prefetches
  // at its own pace; several spread the bytes evenly (tile t0 takes [t0/n, (t0 + K)/n) of them), so
  // the memory stays busy while the later tiles compute from cache.
  using w_t = typename P::w_t;
  const char* next = r0 + R_ < pb.R ? reinterpret_cast<const char*>(W + (r0 + R_) * C) : nullptr;
  constexpr int64_t kStepBytes = R_ * P::step * sizeof(w_t);  // of the block, per step
  const int64_t bytes = R_ * C * int64_t(sizeof(w_t)), to = bytes * (t0 + K) / pb.n;
  const int64_t per = Cv > 0 ? ((to - bytes * t0 / pb.n) * P::step + Cv - 1) / Cv : 0;  // bytes per step
  int64_t due = bytes * t0 / pb.n, line = due & ~int64_t(63);
  for (int64_t c = 0; c < Cv; c += P::step) {
    if (next && pb.n <= TT) {
      const char* ahead = next + c * R_ * sizeof(w_t);
#pragma GCC unroll 8
      for (int64_t off = 0; off < kStepBytes; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T1);
    } else if (next) {
      due += per;
      for (; line < std::min(due, to); line += 64) _mm_prefetch(next + line, _MM_HINT_T1);
    }
    typename P::wv w[R_];
#pragma GCC unroll 4
    for (int i = 0; i < R_; ++i) w[i] = P::loadw(W + (r0 + i) * C + c);
#pragma GCC unroll 4
    for (int k = 0; k < K; ++k) {
      typename P::xv v = P::loadx(x + (t0 + k) * C + c);
#pragma GCC unroll 4
      for (int i = 0; i < R_; ++i) acc[i][k] = P::madd(acc[i][k], w[i], v);
    }
  }
  for (int i = 0; i < R_; ++i)
    for (int k = 0; k < K; ++k) {
      float s = vsum(acc[i][k]);
      for (int64_t c = Cv; c < C; ++c) s += to_f(W[(r0 + i) * C + c]) * to_f(x[(t0 + k) * C + c]);
      if (b) s += to_f(b[r0 + i]);
      out[(t0 + k) * pb.R + r0 + i] = from_f<O>(s);
    }
}

// Weight rows [r0, r0 + R_) against all n input rows, tile after tile: they come from memory (or L2,
// prefetched) once, then from cache.
template <class P, int R_, class O>
inline void block(const Problem& pb, const typename P::w_t* W, const typename P::w_t* b, const typename P::x_t* x,
                  int64_t r0, O* out) {
  int64_t t = 0;
  for (; t + TT <= pb.n; t += TT) tile<P, R_, TT>(pb, W, b, x, r0, t, out);
  switch (pb.n - t) {
    case 1: tile<P, R_, 1>(pb, W, b, x, r0, t, out); break;
    case 2: tile<P, R_, 2>(pb, W, b, x, r0, t, out); break;
    case 3: tile<P, R_, 3>(pb, W, b, x, r0, t, out); break;
    default: break;
  }
}

constexpr int64_t kAlign = 16;  // thread ranges in multiples of 16 rows: whole tiles, no shared output lines

inline std::pair<int64_t, int64_t> share(int64_t n, int nth, int tid) {
  int64_t chunk = (n + nth - 1) / nth;
  chunk = (chunk + kAlign - 1) / kAlign * kAlign;
  int64_t lo = std::min(n, tid * chunk);
  return {lo, std::min(n, lo + chunk)};
}

template <class P, class O>
void run(const Problem& pb, const typename P::w_t* W, const typename P::w_t* b, const typename P::x_t* x, O* out,
         int threads) {
#pragma omp parallel num_threads(threads)
  {
    const auto [lo, hi] = share(pb.R, omp_get_num_threads(), omp_get_thread_num());
    int64_t r = lo;
    for (; r + RT <= hi; r += RT) block<P, RT>(pb, W, b, x, r, out);
    for (; r < hi; ++r) block<P, 1>(pb, W, b, x, r, out);
  }
}

template <class P>
void run_typed(const Problem& pb, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& out,
               int threads) {
  using w_t = typename P::w_t;
  using x_t = typename P::x_t;
  const at::Tensor xs = std::is_same_v<x_t, float> ? x.to(at::kFloat).contiguous() : x;
  const auto* wp = reinterpret_cast<const w_t*>(w.data_ptr());
  const auto* bp = b.defined() ? reinterpret_cast<const w_t*>(b.data_ptr()) : nullptr;
  const auto* xp = reinterpret_cast<const x_t*>(xs.data_ptr());
  if constexpr (std::is_same_v<w_t, float>)
    run<P>(pb, wp, bp, xp, reinterpret_cast<float*>(out.data_ptr()), threads);
  else
    run<P>(pb, wp, bp, xp, reinterpret_cast<bf16*>(out.data_ptr()), threads);
}

// x [..., C] (n rows) and weight [R, C] of one dtype (float32 or bfloat16), bias [R] or none -> [..., R]
// in that dtype. The flattening is here, not in Python: ~4 us there, more than a small layer's F.linear.
at::Tensor linear(const at::Tensor& x_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() >= 1 && weight.dim() == 2 && x_in.size(-1) == weight.size(1),
              "expected x [..., C] and weight [R, C], got x ", x_in.sizes(), " and weight ", weight.sizes());
  TORCH_CHECK(weight.is_contiguous() && x_in.device().is_cpu() && weight.device().is_cpu(),
              "compiled linear needs CPU tensors and a contiguous weight");
  const auto dtype = weight.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "weight must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(x_in.scalar_type() == dtype, "x and weight must share one dtype, got ", x_in.scalar_type(), " and ",
              dtype);
  const at::Tensor x = x_in.reshape({-1, x_in.size(-1)}).contiguous();  // [n, C]
  at::Tensor b;
  if (bias) b = bias->contiguous();
  TORCH_CHECK(!b.defined() || (b.scalar_type() == dtype && b.numel() == weight.size(0)), "bias must be [R] in ",
              dtype);
  const Problem pb{x.size(0), x.size(1), weight.size(0)};
  std::vector<int64_t> sizes = x_in.sizes().vec();
  sizes.back() = pb.R;
  at::Tensor out = at::empty(sizes, x.options());  // [..., R], contiguous: [n, R]
  if (pb.n == 0 || pb.R == 0) return out;
  // A small weight's read is shorter than waking a second thread; omp_in_parallel: no nested teams.
  const bool small = weight.numel() * weight.element_size() < (1 << 20);
  const int threads = (small || omp_in_parallel()) ? 1 : at::get_num_threads();
  if (dtype == at::kFloat) {
    run_typed<F32>(pb, x, weight, b, out, threads);
  } else {
#if defined(__AVX512BF16__)
    run_typed<BF16DP>(pb, x, weight, b, out, threads);
#else
    run_typed<BF16>(pb, x, weight, b, out, threads);
#endif
  }
  return out;
}

std::string isa() { return std::string(kIsa) + (kDpbf16 ? "+bf16" : ""); }

}  // namespace

#define MOESPEC_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)  // expands MOESPEC_OPS before TORCH_LIBRARY pastes it
MOESPEC_LIBRARY(MOESPEC_OPS, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor", &linear);
  m.def("isa() -> str", &isa);
}
