// The executor's element types. The model computes in a compute type S (the precision policy's,
// documents/job.hpp): float (fp32, TF32 GEMMs on a GPU), bf16 or f16 (bf16-mixed, fp16-mixed);
// double serves the gradient check. Whatever S, arithmetic accumulates in accum_t<S> (fp32 for the
// 16-bit types, as cuBLAS's CUBLAS_COMPUTE_32F and PyTorch's acc_type do), and the values that
// need its range stay in it: norm statistics, attention's log-sum-exp, the loss's log-probabilities
// and their gradient (PyTorch computes the loss in fp32), master weights, kept gradients and
// optimizer states.
//
// bf16 and f16 are storage only: 16 bits laid out as CUDA's __nv_bfloat16 and __half, converted
// with core/half_float.hpp's rounding (to nearest, ties to even). Arithmetic on them is explicit:
// widen(x) to accum_t, narrow<S>(a) back.
#pragma once

#include <cstdint>
#include <type_traits>

#include "comm/data_type.hpp"
#include "core/half_float.hpp"

namespace shardplan::kernels {

struct bf16 {
  std::uint16_t bits = 0;  // the upper half of an IEEE 754 binary32
};
struct f16 {
  std::uint16_t bits = 0;  // IEEE 754 binary16
};

template <class S>
inline constexpr bool is_half_v = std::is_same_v<S, bf16> || std::is_same_v<S, f16>;

template <class S> using accum_t = std::conditional_t<is_half_v<S>, float, S>;

inline float widen(bf16 x) { return core::bf16_to_float(x.bits); }
inline float widen(f16 x) { return core::f16_to_float(x.bits); }
inline float widen(float x) { return x; }
inline double widen(double x) { return x; }

template <class S> inline S narrow(accum_t<S> a) {
  if constexpr (std::is_same_v<S, bf16>)
    return bf16{core::float_to_bf16(a)};
  else if constexpr (std::is_same_v<S, f16>)
    return f16{core::float_to_f16(a)};
  else
    return a;
}

// The collectives' element type of S.
template <class S>
constexpr comm::DataType data_type_v = std::is_same_v<S, bf16>    ? comm::DataType::bf16
                                       : std::is_same_v<S, f16>   ? comm::DataType::f16
                                       : std::is_same_v<S, float> ? comm::DataType::f32
                                                                  : comm::DataType::f64;

}  // namespace shardplan::kernels
