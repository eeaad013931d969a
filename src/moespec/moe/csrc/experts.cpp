// Compiled expert kernels of moespec (the why is in moespec/moe/compiled.py).
//
// One call runs a whole MoE layer's experts: for each group of slots (each distinct expert of the
// pass when deduplicating, each slot alone when not), it reads the expert's gate/up matrix once for
// all the group's tokens, applies the gated activation, reads the down matrix once, and adds the
// routing-weighted rows into the output. All threads share each expert: thread p owns a fixed range
// of intermediate units (their gate and up rows and the matching columns of down), so every weight
// byte is read by exactly one thread, and the threads meet once per call, not once per expert.
//
// Built once per ISA (compiled.py passes the -m flags and -DMOESPEC_OPS=<op namespace>):
// AVX-512 with AVX512_BF16 dot products, AVX-512 alone, or AVX2 + FMA.
//
// Shapes: T tokens, m slots per token, S = T*m slots, N experts, H hidden, I intermediate, O = 2I.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
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
constexpr int RT = 4, TT = 4;  // dot tile: 4 rows x 4 tokens = 16 of 32 zmm registers
constexpr int RV = 4;          // transposed tile: 4 vectors of columns x TT tokens
#else
constexpr int RT = 2, TT = 4;  // 8 accumulators + 2 weights + 1 token of 16 ymm registers
constexpr int RV = 2;
#endif

// y[t0 + tt, r0 + rt] = W[r0 + rt, :C] . X[tt][:C] for a tile of R rows x K tokens (row stride ld).
// While it computes, the next tile's rows (up to row hi) stream into L2 by software prefetch, column
// for column: the hardware prefetchers alone left the kernel at 63-83% of the read roof (the down
// matrix's rows are read in short strided pieces), with it 88-98% (OLMoE widths, n = 1, 4, 8).
template <class P, int R, int K, class Epi>
inline void dot_tile(const typename P::w_t* W, int64_t ld, int64_t C, int64_t r0, int64_t hi,
                     const typename P::x_t* const* X, int t0, Epi& epi) {
  const int ahead = int(std::clamp<int64_t>(hi - (r0 + R), 0, R));  // rows of the next tile
  vf acc[R][K];
#pragma GCC unroll 16
  for (int i = 0; i < R * K; ++i) acc[i / K][i % K] = vzero();
  const int64_t Cv = C - C % P::step;
  for (int64_t c = 0; c < Cv; c += P::step) {
    typename P::wv w[R];
#pragma GCC unroll 4
    for (int rt = 0; rt < ahead; ++rt)
      _mm_prefetch(reinterpret_cast<const char*>(W + (r0 + R + rt) * ld + c), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int rt = 0; rt < R; ++rt) w[rt] = P::loadw(W + (r0 + rt) * ld + c);
#pragma GCC unroll 4
    for (int tt = 0; tt < K; ++tt) {
      typename P::xv x = P::loadx(X[tt] + c);
#pragma GCC unroll 4
      for (int rt = 0; rt < R; ++rt) acc[rt][tt] = P::madd(acc[rt][tt], w[rt], x);
    }
  }
  for (int rt = 0; rt < R; ++rt)
    for (int tt = 0; tt < K; ++tt) {
      float s = vsum(acc[rt][tt]);
      for (int64_t c = Cv; c < C; ++c) s += to_f(W[(r0 + rt) * ld + c]) * to_f(X[tt][c]);
      epi(r0 + rt, t0 + tt, s);
    }
}

template <class P, int R, class Epi>
inline void dot_tokens(const typename P::w_t* W, int64_t ld, int64_t C, int64_t r0, int64_t hi,
                       const typename P::x_t* const* X, int g, Epi& epi) {
  int t = 0;
  for (; t + TT <= g; t += TT) dot_tile<P, R, TT>(W, ld, C, r0, hi, X + t, t, epi);
  switch (g - t) {  // the last 1..TT-1 tokens; the rows just read are still in L1/L2
    case 1: dot_tile<P, R, 1>(W, ld, C, r0, hi, X + t, t, epi); break;
    case 2: dot_tile<P, R, 2>(W, ld, C, r0, hi, X + t, t, epi); break;
    case 3: dot_tile<P, R, 3>(W, ld, C, r0, hi, X + t, t, epi); break;
    default: break;
  }
}

// Rows [lo, hi) of the row-major W [., ld] (their first C columns) times each token row X[t] [C].
template <class P, class Epi>
void dot_rows(const typename P::w_t* W, int64_t ld, int64_t C, int64_t lo, int64_t hi,
              const typename P::x_t* const* X, int g, Epi& epi) {
  int64_t r = lo;
  for (; r + RT <= hi; r += RT) dot_tokens<P, RT>(W, ld, C, r, hi, X, g, epi);
  for (; r < hi; ++r) dot_tokens<P, 1>(W, ld, C, r, hi, X, g, epi);
}

// Transposed storage Wt [C, R] (gpt-oss): columns [r0, r0 + V*L) accumulate x[c] * Wt[c, cols].
template <class W, int V, int K, class Epi>
inline void axpy_tile(const W* Wt, int64_t R, int64_t C, int64_t r0, const float* const* X, int t0, Epi& epi) {
  vf acc[V][K];
#pragma GCC unroll 16
  for (int i = 0; i < V * K; ++i) acc[i / K][i % K] = vzero();
  for (int64_t c = 0; c < C; ++c) {
    vf w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) w[v] = vload(Wt + c * R + r0 + v * L);
#pragma GCC unroll 4
    for (int tt = 0; tt < K; ++tt) {
      vf x = vset1(X[tt][c]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[v][tt] = vfma(w[v], x, acc[v][tt]);
    }
  }
  alignas(64) float lanes[L];
  for (int v = 0; v < V; ++v)
    for (int tt = 0; tt < K; ++tt) {
      vstore(lanes, acc[v][tt]);
      for (int l = 0; l < L; ++l) epi(r0 + v * L + l, t0 + tt, lanes[l]);
    }
}

template <class W, int V, class Epi>
inline void axpy_tokens(const W* Wt, int64_t R, int64_t C, int64_t r0, const float* const* X, int g, Epi& epi) {
  int t = 0;
  for (; t + TT <= g; t += TT) axpy_tile<W, V, TT>(Wt, R, C, r0, X + t, t, epi);
  switch (g - t) {
    case 1: axpy_tile<W, V, 1>(Wt, R, C, r0, X + t, t, epi); break;
    case 2: axpy_tile<W, V, 2>(Wt, R, C, r0, X + t, t, epi); break;
    case 3: axpy_tile<W, V, 3>(Wt, R, C, r0, X + t, t, epi); break;
    default: break;
  }
}

// Columns [lo, hi) of the transposed Wt [C, R] times each of the g token rows X[t] [C].
template <class W, class Epi>
void axpy_cols(const W* Wt, int64_t R, int64_t C, int64_t lo, int64_t hi, const float* const* X, int g, Epi& epi) {
  int64_t r = lo;
  for (; r + RV * L <= hi; r += RV * L) axpy_tokens<W, RV>(Wt, R, C, r, X, g, epi);
  for (; r + L <= hi; r += L) axpy_tokens<W, 1>(Wt, R, C, r, X, g, epi);
  for (; r < hi; ++r)  // fewer than L columns left: scalar
    for (int t = 0; t < g; ++t) {
      float s = 0.f;
      for (int64_t c = 0; c < C; ++c) s += to_f(Wt[c * R + r]) * X[t][c];
      epi(r, t, s);
    }
}

enum Activation : int64_t { SILU_CONCAT = 0, SILU_INTERLEAVED = 1, GPTOSS = 2 };

struct Layout {
  int64_t N, H, I, T, m;
  bool transposed;
  int64_t act;
  float alpha, limit;
};

inline float activate(const Layout& lay, const float* y, int64_t i) {  // y: one token's up row [O]
  if (lay.act == SILU_CONCAT) {
    float g = y[i];
    return g / (1.f + std::exp(-g)) * y[lay.I + i];
  }
  float g = y[2 * i], u = y[2 * i + 1];
  if (lay.act == SILU_INTERLEAVED) return g / (1.f + std::exp(-g)) * u;
  g = std::min(g, lay.limit);  // gpt-oss: clamped gate, (up + 1) * gate * sigmoid(alpha * gate)
  u = std::min(std::max(u, -lay.limit), lay.limit);
  return (u + 1.f) * (g / (1.f + std::exp(-lay.alpha * g)));
}

constexpr int64_t kAlign = 64;  // thread ranges in multiples of 64 units: whole tiles, no shared lines

inline std::pair<int64_t, int64_t> share(int64_t n, int nth, int tid) {
  int64_t chunk = (n + nth - 1) / nth;
  chunk = (chunk + kAlign - 1) / kAlign * kAlign;
  int64_t lo = std::min(n, tid * chunk);
  return {lo, std::min(n, lo + chunk)};
}

// The groups of a pass: slots (s = t*m + k) ordered by group; group j is slots[begin[j]:begin[j+1]].
struct Groups {
  std::vector<int64_t> slots, begin, expert;
  int64_t largest = 0;
};

Groups make_groups(const int64_t* ids, int64_t S, int64_t N, bool dedup) {
  Groups gr;
  gr.slots.resize(S);
  for (int64_t s = 0; s < S; ++s)
    TORCH_CHECK(ids[s] >= 0 && ids[s] < N, "expert id ", ids[s], " at slot ", s, " is outside [0, ", N, ")");
  if (!dedup) {
    for (int64_t s = 0; s < S; ++s) {
      gr.slots[s] = s;
      gr.begin.push_back(s);
      gr.expert.push_back(ids[s]);
    }
    gr.begin.push_back(S);
    gr.largest = S > 0 ? 1 : 0;
    return gr;
  }
  std::vector<int64_t> start(N + 1, 0);  // counting sort by expert, stable in slot order
  for (int64_t s = 0; s < S; ++s) ++start[ids[s] + 1];
  for (int64_t e = 0; e < N; ++e) {
    if (start[e + 1] > 0) {
      gr.begin.push_back(start[e]);
      gr.expert.push_back(e);
      gr.largest = std::max(gr.largest, start[e + 1]);
    }
    start[e + 1] += start[e];
  }
  gr.begin.push_back(S);
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t s = 0; s < S; ++s) gr.slots[next[ids[s]]++] = s;
  return gr;
}

// up, down: one expert's weights after the other; ub [N, O] and db [N, H] or null; x [T, H]; out [T, H].
//
// Thread p owns the intermediate units [i_lo, i_hi): their gate and up rows, their activations, and
// the matching columns of down, whose partial sums it adds into its own output copy. No thread ever
// reads another's activations, so groups need no barrier: a barrier per expert, on this 2-core
// machine under load, waited out scheduler slices (a 1 ms expert took up to 7 ms).
template <class P, bool TR>
void run(const Layout& lay, const typename P::w_t* up, const typename P::w_t* down, const typename P::w_t* ub,
         const typename P::w_t* db, const typename P::x_t* x, const int64_t* ids, const float* wts, bool dedup,
         float* out, int threads) {
  using x_t = typename P::x_t;
  static_assert(!TR || std::is_same_v<x_t, float>, "the transposed path widens to float32");
  const int64_t H = lay.H, I = lay.I, O = 2 * I, m = lay.m, S = lay.T * m;
  const Groups gr = make_groups(ids, S, lay.N, dedup);
  const int64_t G = int64_t(gr.expert.size()), gmax = gr.largest;
  std::vector<float> Y(gmax * O);   // [gmax, O] up outputs of the current group, columns split by thread
  std::vector<x_t> A(gmax * I);     // [gmax, I] its activations, likewise
  std::vector<const x_t*> xrow(S);  // token row of each grouped slot
  for (int64_t j = 0; j < S; ++j) xrow[j] = x + (gr.slots[j] / m) * H;
  std::vector<std::vector<float>> partial(threads - 1, std::vector<float>(lay.T * H, 0.f));  // [T, H] each
  const bool interleaved = lay.act != SILU_CONCAT;

#pragma omp parallel num_threads(threads)
  {
    const int nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const auto [i_lo, i_hi] = share(I, nth, tid);
    const int64_t K = i_hi - i_lo;
    float* acc = tid == 0 ? out : partial[tid - 1].data();
    std::vector<const x_t*> arow(gmax);  // this thread's slice of each activation row
    for (int64_t t = 0; t < gmax; ++t) arow[t] = A.data() + t * I + i_lo;
    for (int64_t j = 0; j < G && K > 0; ++j) {
      const int64_t e = gr.expert[j], b = gr.begin[j];
      const int g = int(gr.begin[j + 1] - b);
      const auto* Wu = up + e * O * H;
      const auto* Wd = down + e * H * I;
      const auto* bu = ub ? ub + e * O : nullptr;
      const auto* bd = (db && tid == 0) ? db + e * H : nullptr;  // one thread adds the bias
      const x_t* const* X = xrow.data() + b;
      auto up_epi = [&](int64_t r, int t, float v) { Y[t * O + r] = v + (bu ? to_f(bu[r]) : 0.f); };
      auto up_range = [&](int64_t lo, int64_t hi) {
        if constexpr (TR) axpy_cols(Wu, O, H, lo, hi, X, g, up_epi);
        else dot_rows<P>(Wu, H, H, lo, hi, X, g, up_epi);
      };
      if (interleaved) {
        up_range(2 * i_lo, 2 * i_hi);
      } else {
        up_range(i_lo, i_hi);
        up_range(I + i_lo, I + i_hi);
      }
      for (int t = 0; t < g; ++t)
        for (int64_t i = i_lo; i < i_hi; ++i) A[t * I + i] = from_f<x_t>(activate(lay, Y.data() + t * O, i));
      auto down_epi = [&](int64_t h, int t, float v) {
        const int64_t s = gr.slots[b + t];
        acc[(s / m) * H + h] += wts[s] * (v + (bd ? to_f(bd[h]) : 0.f));
      };
      if constexpr (TR) axpy_cols(Wd + i_lo * H, H, K, 0, H, arow.data(), g, down_epi);  // rows i of [I, H]
      else dot_rows<P>(Wd + i_lo, I, K, 0, H, arow.data(), g, down_epi);  // columns i of [H, I]
    }
  }
  for (const auto& p : partial)
    for (int64_t k = 0; k < lay.T * H; ++k) out[k] += p[k];
}

template <class P>
void run_layout(const Layout& lay, const at::Tensor& up, const at::Tensor& down, const at::Tensor& ub,
                const at::Tensor& db, const at::Tensor& x, const at::Tensor& ids, const at::Tensor& wts, bool dedup,
                at::Tensor& out, int threads) {
  using w_t = typename P::w_t;
  using x_t = typename P::x_t;
  auto w = [](const at::Tensor& t) { return t.defined() ? reinterpret_cast<const w_t*>(t.data_ptr()) : nullptr; };
  const at::Tensor xs = std::is_same_v<x_t, float> ? x.to(at::kFloat).contiguous() : x;
  const auto* xp = reinterpret_cast<const x_t*>(xs.data_ptr());
  auto* op = out.data_ptr<float>();
  if (lay.transposed) {
    if constexpr (std::is_same_v<x_t, float>)
      run<P, true>(lay, w(up), w(down), w(ub), w(db), xp, ids.data_ptr<int64_t>(), wts.data_ptr<float>(), dedup,
                   op, threads);
  } else {
    run<P, false>(lay, w(up), w(down), w(ub), w(db), xp, ids.data_ptr<int64_t>(), wts.data_ptr<float>(), dedup, op,
                  threads);
  }
}

// x [T, H] in the weights' dtype; index [T, m] int64; weights [T, m] float32; up [N, O, H] ([N, H, O]
// transposed); down [N, H, I] ([N, I, H]); up_bias [N, O], down_bias [N, H] -> [T, H] float32.
at::Tensor experts(const at::Tensor& x, const at::Tensor& index, const at::Tensor& weights, const at::Tensor& up,
                   const at::Tensor& down, const std::optional<at::Tensor>& up_bias,
                   const std::optional<at::Tensor>& down_bias, bool transposed, int64_t act, double alpha,
                   double limit, bool dedup) {
  TORCH_CHECK(up.dim() == 3 && down.dim() == 3 && x.dim() == 2, "expected 3-D weights and a 2-D x");
  for (const at::Tensor* t : {&x, &up, &down, &index, &weights})
    TORCH_CHECK(t->is_contiguous() && t->device().is_cpu(), "compiled experts need contiguous CPU tensors");
  const auto dtype = up.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "weights must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(down.scalar_type() == dtype && x.scalar_type() == dtype, "x, up and down must share one dtype");
  TORCH_CHECK(index.scalar_type() == at::kLong && weights.scalar_type() == at::kFloat, "index int64, weights float32");
  TORCH_CHECK(act == SILU_CONCAT || act == SILU_INTERLEAVED || act == GPTOSS, "unknown activation ", act);
  const int64_t N = up.size(0), H = x.size(1);
  const int64_t I = transposed ? down.size(1) : down.size(2);
  const auto up_shape = transposed ? std::vector<int64_t>{N, H, 2 * I} : std::vector<int64_t>{N, 2 * I, H};
  const auto down_shape = transposed ? std::vector<int64_t>{N, I, H} : std::vector<int64_t>{N, H, I};
  TORCH_CHECK(up.sizes() == at::IntArrayRef(up_shape) && down.sizes() == at::IntArrayRef(down_shape),
              "inconsistent expert weights: up ", up.sizes(), ", down ", down.sizes(), ", x ", x.sizes());
  TORCH_CHECK(index.dim() == 2 && index.size(0) == x.size(0) && weights.sizes() == index.sizes(),
              "index and weights must both be [T, m] with T = ", x.size(0));
  at::Tensor ub, db;
  if (up_bias) ub = up_bias->contiguous();
  if (down_bias) db = down_bias->contiguous();
  TORCH_CHECK(!ub.defined() || (ub.scalar_type() == dtype && ub.numel() == N * 2 * I), "up bias must be [N, O]");
  TORCH_CHECK(!db.defined() || (db.scalar_type() == dtype && db.numel() == N * H), "down bias must be [N, H]");
  const Layout lay{N, H, I, x.size(0), index.size(1), transposed, act, float(alpha), float(limit)};
  at::Tensor out = at::zeros({x.size(0), H}, x.options().dtype(at::kFloat));
  // A tiny layer's work is shorter than waking a second thread; omp_in_parallel: no nested teams.
  const bool small = 3 * H * I * up.element_size() < (1 << 20);
  const int threads = (small || omp_in_parallel()) ? 1 : at::get_num_threads();
  if (dtype == at::kFloat) {
    run_layout<F32>(lay, up, down, ub, db, x, index, weights, dedup, out, threads);
  } else {
#if defined(__AVX512BF16__)
    if (!transposed) {
      run_layout<BF16DP>(lay, up, down, ub, db, x, index, weights, dedup, out, threads);
      return out;
    }
#endif
    run_layout<BF16>(lay, up, down, ub, db, x, index, weights, dedup, out, threads);
  }
  return out;
}

std::string isa() { return std::string(kIsa) + (kDpbf16 ? "+bf16" : ""); }

}  // namespace

#define MOESPEC_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)  // expands MOESPEC_OPS before TORCH_LIBRARY pastes it
MOESPEC_LIBRARY(MOESPEC_OPS, m) {
  m.def(
      "experts(Tensor x, Tensor index, Tensor weights, Tensor up, Tensor down, Tensor? up_bias, "
      "Tensor? down_bias, bool transposed, int act, float alpha, float limit, bool dedup) -> Tensor",
      &experts);
  m.def("isa() -> str", &isa);
}
