// The CUDA backend's native bf16 rows of the op table (cuda_rows.inc lists
// them; kernels/cuda/op_rows.cpp defines them). op_table.cpp adds the f32
// rows and the staged bf16 rows of the other ops.
#pragma once
#include <span>

#include "trident/kernels/op_table.hpp"

namespace trident::kernels::cuda {

std::span<const OpRow> bf16_rows();

}  // namespace trident::kernels::cuda
