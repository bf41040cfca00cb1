/* The C interface of nvfp4-gemm (host/src/raw.rs; its docs are the reference).
 *
 * Build a library exporting it: cargo rustc -p nvfp4-gemm --release --crate-type cdylib
 * (target/release/libnvfp4_gemm.so; or --crate-type staticlib).
 *
 * Every function returning int returns a status (NVFP4_OK, ...) and writes the error's text,
 * NUL-terminated and truncated, into err/err_len (may be NULL/0). Buffers are device addresses
 * with lengths in elements (bytes for NVFP4 values and scales, 16-bit elements for f16/bf16,
 * uint32 for MoE sizes); every buffer is validated against the plan before anything is launched
 * (lengths, 16-byte alignment, overlaps, finite alphas). Streams are borrowed: a CUstream of the
 * device's primary context (the CUDA runtime's), or NULL for the legacy default stream. Nothing
 * synchronizes the host except plan creation (it waits for the plan's own memory). */
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

/* Element type of C (and of the quantizer's dense tensors). */
#define NVFP4_F16 0
#define NVFP4_BF16 1

/* MoE token layouts. */
#define NVFP4_CONTIGUOUS 0
#define NVFP4_MASKED 1

typedef struct nvfp4_device nvfp4_device;
typedef struct nvfp4_gemm_plan nvfp4_gemm_plan;
typedef struct nvfp4_moe_plan nvfp4_moe_plan;
typedef struct CUstream_st *nvfp4_stream; /* a CUstream */

typedef struct { uint64_t ptr; uint64_t len; } nvfp4_buffer;
typedef struct { nvfp4_buffer values; nvfp4_buffer scales; } nvfp4_operand; /* scales: 128x4 blocked */
typedef struct { nvfp4_operand a; nvfp4_operand b; nvfp4_buffer c; float alpha; } nvfp4_group_args;
typedef struct { nvfp4_operand a; nvfp4_operand b; nvfp4_buffer c; } nvfp4_stacked_args;
typedef struct { nvfp4_buffer sizes; nvfp4_operand a; nvfp4_buffer c; } nvfp4_moe_args;
typedef struct { uint64_t m; uint64_t n; uint64_t k; } nvfp4_shape;

int nvfp4_device_open(int ordinal, nvfp4_device **out, char *err, size_t err_len);
void nvfp4_device_close(nvfp4_device *dev);

int nvfp4_gemm_plan_create(const nvfp4_device *dev, const nvfp4_shape *shapes, size_t groups,
                           uint32_t c_type, nvfp4_gemm_plan **out, char *err, size_t err_len);
void nvfp4_gemm_plan_destroy(nvfp4_gemm_plan *plan);
int nvfp4_gemm_run(nvfp4_gemm_plan *plan, nvfp4_stream stream, const nvfp4_group_args *args,
                   size_t groups, uint32_t c_type, char *err, size_t err_len);
int nvfp4_gemm_run_stacked(nvfp4_gemm_plan *plan, nvfp4_stream stream, const nvfp4_stacked_args *args,
                           const float *alphas, size_t groups, uint32_t c_type, char *err, size_t err_len);

int nvfp4_moe_plan_create(const nvfp4_device *dev, uint64_t groups, uint64_t n, uint64_t k,
                          uint32_t layout, uint64_t bound, uint32_t c_type, nvfp4_moe_plan **out,
                          char *err, size_t err_len);
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

#ifdef __cplusplus
}
#endif

#endif /* NVFP4_GEMM_H */
