// placeholder: the Ampere forward kernel is being written.
#include "tessera/attention_params.cuh"
extern "C" __global__ void flash_fwd_sm80(const __grid_constant__ ts::AttentionParams p) {}
