/* The C interface of nvfp4-gemm (host/src/capi.rs; its docs are the reference). Checked against
 * the Rust side by host/tests/c_header.rs (prototypes, constants, and every struct's size and field
 * offsets through a C compiler): change both together.
 *
 * Build a library exporting it: cargo rustc -p nvfp4-gemm --release --crate-type cdylib
 * (target/release/libnvfp4_gemm.so; or --crate-type staticlib).
 *
 * Every function returning int returns a status (NVFP4_OK, ...) and writes the error's text,
 * NUL-terminated and truncated, into err/err_len (may be NULL/0). Buffers are device addresses
 * with lengths in elements (bytes for NVFP4 values and scales, 16-bit elements for f16/bf16,
 * uint32 for MoE sizes, float for device alphas); every buffer is validated against the plan before
 * anything is launched (lengths, 16-byte alignment, overlaps, types, finite host alphas). Streams are
 * borrowed: a CUstream of the device's primary context (the CUDA runtime's), or NULL for the legacy
 * default stream. Nothing synchronizes the host except plan creation (it waits for the plan's own
 * memory).
 *
 * W4A16 (sm_90a; NVFP4_UNSUPPORTED on sm_100a): a plan created with the token type NVFP4_TOKENS_F16
 * or NVFP4_TOKENS_BF16 takes 16-bit activations as A: a.values of nvfp4_group_args,
 * nvfp4_stacked_args and nvfp4_moe_args holds them (length in 16-bit elements) and a.scales is
 * empty ({0, 0}); its weights are prepacked once, on the host by nvfp4_w4a16_prepack or on the GPU
 * by nvfp4_w4a16_prepack_device (a stack of experts in device memory; the same bytes). */
#ifndef NVFP4_GEMM_H
#define NVFP4_GEMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NVFP4_OK 0
#define NVFP4_INVALID 1
#define NVFP4_UNSUPPORTED 2
#define NVFP4_NO_DRIVER 3
#define NVFP4_DRIVER 4
#define NVFP4_PANIC 5
/* Inside a CUDA graph capture where the plan cannot take the call (it would allocate: the first
 * call after an earlier capture); nothing captured. Call it once outside capture, then capture. */
#define NVFP4_CAPTURE 6

/* Element type of C (and of the quantizer's dense tensors). */
#define NVFP4_F16 0
#define NVFP4_BF16 1

/* MoE token layouts. */
#define NVFP4_CONTIGUOUS 0
#define NVFP4_MASKED 1

/* Token type of a plan: NVFP4 tokens (W4A4), or W4A16's f16 or bf16 activations. */
#define NVFP4_TOKENS_NVFP4 0
#define NVFP4_TOKENS_F16 1
#define NVFP4_TOKENS_BF16 2

/* A checkpoint's convention (ModelOpt's scales, or compressed-tensors' inverse ones), its
 * projection names, and what to do with w1/w3 global scales that differ. */
#define NVFP4_MODELOPT 0
#define NVFP4_COMPRESSED_TENSORS 1
#define NVFP4_PROJECTIONS_W1_W3_W2 0
#define NVFP4_PROJECTIONS_GATE_UP_DOWN 1
#define NVFP4_RECONCILE_REFUSE 0
#define NVFP4_RECONCILE_EXACT 1
#define NVFP4_RECONCILE_ROUND 2

/* The expert block: its activation, precision and flags, the router's id and weight types. */
#define NVFP4_SILU 0
#define NVFP4_GELU_TANH 1
#define NVFP4_RELU2 2
#define NVFP4_W4A4 0
#define NVFP4_W4A16 1
#define NVFP4_BLOCK_WEIGHT_AT_INPUT 1
#define NVFP4_BLOCK_ACTIVATION_EPILOGUE 2
#define NVFP4_IDS_I32 0
#define NVFP4_IDS_I64 1
#define NVFP4_WEIGHTS_F32 0
#define NVFP4_WEIGHTS_BF16 1

typedef struct nvfp4_device nvfp4_device;
typedef struct nvfp4_gemm_plan nvfp4_gemm_plan;
typedef struct nvfp4_moe_plan nvfp4_moe_plan;
typedef struct nvfp4_expert_block nvfp4_expert_block;
typedef struct CUstream_st *nvfp4_stream; /* a CUstream */

typedef struct { uint64_t ptr; uint64_t len; } nvfp4_buffer;
/* scales: 128x4 blocked. As a W4A16 plan's A: values = the activations, scales = {0, 0}. */
typedef struct { nvfp4_buffer values; nvfp4_buffer scales; } nvfp4_operand;
typedef struct { nvfp4_operand a; nvfp4_operand b; nvfp4_buffer c; float alpha; } nvfp4_group_args;
typedef struct { nvfp4_operand a; nvfp4_operand b; nvfp4_buffer c; } nvfp4_stacked_args;
typedef struct { nvfp4_buffer sizes; nvfp4_operand a; nvfp4_buffer c; } nvfp4_moe_args;
typedef struct { uint64_t m; uint64_t n; uint64_t k; } nvfp4_shape;
/* One safetensors shard's bytes, on the host. */
typedef struct { const uint8_t *data; size_t len; } nvfp4_host_bytes;
/* The expert block: the rank's experts first_expert .. first_expert + experts (the checkpoint's
 * numbering), top_k, the token bound, NVFP4_SILU/GELU_TANH/RELU2, NVFP4_W4A4/W4A16, NVFP4_F16/BF16,
 * NVFP4_BLOCK_* flags. */
typedef struct {
    uint64_t first_expert;
    uint64_t experts;
    uint64_t top_k;
    uint64_t max_tokens;
    uint32_t activation;
    uint32_t precision;
    uint32_t dtype;
    uint32_t flags;
} nvfp4_block_desc;

int nvfp4_device_open(int ordinal, nvfp4_device **out, char *err, size_t err_len);
void nvfp4_device_close(nvfp4_device *dev);

int nvfp4_gemm_plan_create(const nvfp4_device *dev, const nvfp4_shape *shapes, size_t groups,
                           uint32_t c_type, nvfp4_gemm_plan **out, char *err, size_t err_len);
/* token_type: NVFP4_TOKENS_*. nvfp4_gemm_plan_create is this with NVFP4_TOKENS_NVFP4. */
int nvfp4_gemm_plan_create_tokens(const nvfp4_device *dev, const nvfp4_shape *shapes, size_t groups,
                                  uint32_t c_type, uint32_t token_type, nvfp4_gemm_plan **out, char *err,
                                  size_t err_len);
void nvfp4_gemm_plan_destroy(nvfp4_gemm_plan *plan);
/* device_alphas: NULL, or a device buffer of `groups` floats read on the device at each call (then
 * args[g].alpha, or `alphas`, is not read; capturable; values not checked: NaN gives NaN). */
int nvfp4_gemm_run(nvfp4_gemm_plan *plan, nvfp4_stream stream, const nvfp4_group_args *args,
                   size_t groups, uint32_t c_type, const nvfp4_buffer *device_alphas, char *err,
                   size_t err_len);
int nvfp4_gemm_run_stacked(nvfp4_gemm_plan *plan, nvfp4_stream stream, const nvfp4_stacked_args *args,
                           const float *alphas, size_t groups, uint32_t c_type,
                           const nvfp4_buffer *device_alphas, char *err, size_t err_len);

int nvfp4_moe_plan_create(const nvfp4_device *dev, uint64_t groups, uint64_t n, uint64_t k,
                          uint32_t layout, uint64_t bound, uint32_t c_type, nvfp4_moe_plan **out,
                          char *err, size_t err_len);
int nvfp4_moe_plan_create_tokens(const nvfp4_device *dev, uint64_t groups, uint64_t n, uint64_t k,
                                 uint32_t layout, uint64_t bound, uint32_t c_type, uint32_t token_type,
                                 nvfp4_moe_plan **out, char *err, size_t err_len);
void nvfp4_moe_plan_destroy(nvfp4_moe_plan *plan);
int nvfp4_moe_run(nvfp4_moe_plan *plan, nvfp4_stream stream, const nvfp4_moe_args *args,
                  const nvfp4_operand *weights, const float *alphas, size_t groups, char *err,
                  size_t err_len);
uint64_t nvfp4_moe_status_address(const nvfp4_moe_plan *plan);
int nvfp4_moe_clear_status(nvfp4_moe_plan *plan, nvfp4_stream stream, char *err, size_t err_len);

int nvfp4_quantize(const nvfp4_device *dev, nvfp4_stream stream, nvfp4_buffer input, uint32_t input_type,
                   uint64_t rows, uint64_t k, float global_scale, const nvfp4_operand *out, char *err,
                   size_t err_len);
int nvfp4_dequantize(const nvfp4_device *dev, nvfp4_stream stream, const nvfp4_operand *input, uint64_t rows,
                     uint64_t k, float global_scale, nvfp4_buffer output, uint32_t output_type, char *err,
                     size_t err_len);
int nvfp4_quantize_grouped(const nvfp4_device *dev, const nvfp4_moe_plan *plan, nvfp4_stream stream,
                           nvfp4_buffer input, uint32_t input_type, nvfp4_buffer sizes, float global_scale,
                           const nvfp4_operand *out, char *err, size_t err_len);

/* Host memory, on the CPU: prepacks a rows x k NVFP4 weight matrix (packed values, blocked scales;
 * k a multiple of 64) for a W4A16 plan of token_type NVFP4_TOKENS_F16 or NVFP4_TOKENS_BF16 into
 * out_values/out_scales of the same lengths (which may be the inputs). The global scale is
 * unchanged. */
int nvfp4_w4a16_prepack(const uint8_t *values, size_t values_len, const uint8_t *scales, size_t scales_len,
                        uint64_t rows, uint64_t k, uint32_t token_type, uint8_t *out_values,
                        uint8_t *out_scales, char *err, size_t err_len);

/* Device memory, on the GPU (sm_90a; NVFP4_UNSUPPORTED on sm_100a): prepacks a stack of experts
 * rows x k NVFP4 weight matrices (input: values experts * rows * k/2 bytes, scales each matrix's
 * blocked bytes back to back) for token_type NVFP4_TOKENS_F16 or NVFP4_TOKENS_BF16 into out (the
 * same lengths, not overlapping the input) on stream: the bytes nvfp4_w4a16_prepack makes of each
 * matrix. No host synchronization. */
int nvfp4_w4a16_prepack_device(const nvfp4_device *dev, nvfp4_stream stream, const nvfp4_operand *input,
                               uint64_t experts, uint64_t rows, uint64_t k, uint32_t token_type,
                               const nvfp4_operand *out, char *err, size_t err_len);

/* The whole expert block of the MoE layer `prefix` (e.g. "model.layers.3.mlp") from a checkpoint's
 * safetensors shards as stored (every tensor checked; H and I from them), weights uploaded on
 * stream (returns when they are on the device). run: x and y [tokens, H] of the block's dtype,
 * topk_ids and topk_weights [tokens, top_k]; no allocation, no host synchronization. */
int nvfp4_expert_block_create(const nvfp4_device *dev, nvfp4_stream stream, const nvfp4_host_bytes *shards,
                              size_t shard_count, const char *prefix, uint32_t convention, uint32_t projections,
                              uint32_t reconcile, const nvfp4_block_desc *desc, nvfp4_expert_block **out,
                              char *err, size_t err_len);
void nvfp4_expert_block_destroy(nvfp4_expert_block *block);
int nvfp4_expert_block_run(nvfp4_expert_block *block, nvfp4_stream stream, nvfp4_buffer x, uint64_t tokens,
                           nvfp4_buffer topk_ids, uint32_t ids_type, nvfp4_buffer topk_weights,
                           uint32_t weights_type, nvfp4_buffer y, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* NVFP4_GEMM_H */
