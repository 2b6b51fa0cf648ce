// The scalar spec of O's dequantisation (qattn/kernels.h): the reference model's three roundings, element by element.
#include "qattn/kernels.h"

namespace qattn::kernels {

void dequantise_s32_f32__scalar(const std::int32_t* acc, Index rows, Index cols, Index acc_stride, double out_scale,
                                int p_scale, float* o, Index o_stride) {
  for (Index i = 0; i < rows; ++i)
    for (Index c = 0; c < cols; ++c)
      o[i * o_stride + c] = static_cast<float>(static_cast<double>(acc[i * acc_stride + c]) * out_scale / p_scale);
}

}  // namespace qattn::kernels
