// recserve: the GPU embedding gather.
//
// Compiled at start-up by NVRTC (core/src/gpu/cuda/kernels.rs), so it includes no headers: fixed-width integers are
// spelled out and fp16 is converted with one PTX instruction.
//
// One launch gathers a whole batch: `ids` is [n] = [rows, fields] row-major, field f of a row reads table
// `field_tables[f]`, and `out` is [n, dim] float32. Each embedding row is read by a group of 2^lanes_log2 threads
// (at most a warp) with vector loads, so consecutive threads read consecutive 4-16 byte pieces of one row
// (coalesced) and a warp serves up to 32 / lanes rows at once.
//
// Semantics are those of the CPU store (core/src/embedding/cpu.rs), bit for bit:
// - the id -> row mapping and the out-of-vocabulary policy of TableSpec::resolve: an id in [0, rows) reads its
//   row; any other id reads `default_row`, or, for a `reject` table (default_row < 0), is refused. The host
//   refuses such batches before launching (and counts default-row reads), so the kernel never sees a rejected
//   id; if it did, it writes NaN rather than reading out of bounds.
// - row -> (shard, row in shard) as ShardLayout::locate: shard = row / rows_per_shard, local = row % rows_per_shard.
// - fp32 rows are copied, fp16 converted exactly, and int8 rows (FBGEMM fused: dim u8 codes, f32 scale, f32 bias)
//   computed as q * scale + bias with separately rounded multiply and add (__fmul_rn, __fadd_rn: never fused into
//   an FMA), which is what the CPU computes.
//
// Tables may be sharded over several GPUs: every GPU that holds shards runs this kernel with its own `device`
// index and writes only the rows whose shard it holds (into `out`, which may be another GPU's memory reached
// through peer access).

struct Shard {
    const unsigned char* data;  // device address of the shard's first row
    int device;                 // index of the GPU that holds it (in the store's device list)
    int reserved;
};

struct TableDesc {
    const Shard* shards;        // [shard count], in the memory of the GPU running the kernel
    long long rows;
    long long rows_per_shard;
    long long default_row;      // < 0: the table rejects unknown ids
    int storage;                // 0 fp32, 1 fp16, 2 int8 (the order of enum Storage)
    int row_bytes;
};

#define STORAGE_FP32 0
#define STORAGE_FP16 1
#define STORAGE_INT8 2

__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float dequantize(unsigned int q, float scale, float bias) {
    return __fadd_rn(__fmul_rn((float)q, scale), bias);
}

// A little-endian f32 at any byte address (int8 rows of a dim that is not a multiple of 4 leave the scale and
// bias unaligned).
__device__ __forceinline__ float load_f32_bytes(const unsigned char* p) {
    unsigned int bits = (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) |
                        ((unsigned int)p[3] << 24);
    return __int_as_float((int)bits);
}

__device__ __forceinline__ void copy_fp32(const unsigned char* src, float* dst, int dim, int lane, int lanes) {
    if ((dim & 3) == 0) {
        const float4* s = reinterpret_cast<const float4*>(src);
        float4* d = reinterpret_cast<float4*>(dst);
        for (int v = lane; v < (dim >> 2); v += lanes) d[v] = __ldg(s + v);
    } else {
        const float* s = reinterpret_cast<const float*>(src);
        for (int j = lane; j < dim; j += lanes) dst[j] = __ldg(s + j);
    }
}

__device__ __forceinline__ void copy_fp16(const unsigned char* src, float* dst, int dim, int lane, int lanes) {
    if ((dim & 7) == 0) {
        // 8 halves (16 bytes) per load, two float4 stores.
        const uint4* s = reinterpret_cast<const uint4*>(src);
        float4* d = reinterpret_cast<float4*>(dst);
        for (int v = lane; v < (dim >> 3); v += lanes) {
            uint4 x = __ldg(s + v);
            unsigned int w[4] = {x.x, x.y, x.z, x.w};
            float f[8];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                f[2 * k] = half_to_float((unsigned short)(w[k] & 0xffffu));
                f[2 * k + 1] = half_to_float((unsigned short)(w[k] >> 16));
            }
            d[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
            d[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
        }
    } else if ((dim & 1) == 0) {
        const unsigned int* s = reinterpret_cast<const unsigned int*>(src);
        float2* d = reinterpret_cast<float2*>(dst);
        for (int v = lane; v < (dim >> 1); v += lanes) {
            unsigned int x = __ldg(s + v);
            d[v] = make_float2(half_to_float((unsigned short)(x & 0xffffu)), half_to_float((unsigned short)(x >> 16)));
        }
    } else {
        const unsigned short* s = reinterpret_cast<const unsigned short*>(src);
        for (int j = lane; j < dim; j += lanes) dst[j] = half_to_float(__ldg(s + j));
    }
}

__device__ __forceinline__ void copy_int8(const unsigned char* src, float* dst, int dim, int lane, int lanes) {
    float scale;
    float bias;
    if ((dim & 3) == 0) {
        scale = __ldg(reinterpret_cast<const float*>(src + dim));
        bias = __ldg(reinterpret_cast<const float*>(src + dim + 4));
    } else {
        scale = load_f32_bytes(src + dim);
        bias = load_f32_bytes(src + dim + 4);
    }
    if ((dim & 7) == 0) {
        // Rows are dim + 8 bytes, so with dim a multiple of 8 every row starts 8-byte aligned: 8 codes per load.
        const uint2* s = reinterpret_cast<const uint2*>(src);
        float4* d = reinterpret_cast<float4*>(dst);
        for (int v = lane; v < (dim >> 3); v += lanes) {
            uint2 x = __ldg(s + v);
            d[2 * v] = make_float4(dequantize(x.x & 0xffu, scale, bias), dequantize((x.x >> 8) & 0xffu, scale, bias),
                                   dequantize((x.x >> 16) & 0xffu, scale, bias), dequantize(x.x >> 24, scale, bias));
            d[2 * v + 1] =
                make_float4(dequantize(x.y & 0xffu, scale, bias), dequantize((x.y >> 8) & 0xffu, scale, bias),
                            dequantize((x.y >> 16) & 0xffu, scale, bias), dequantize(x.y >> 24, scale, bias));
        }
    } else if ((dim & 3) == 0) {
        const unsigned int* s = reinterpret_cast<const unsigned int*>(src);
        float4* d = reinterpret_cast<float4*>(dst);
        for (int v = lane; v < (dim >> 2); v += lanes) {
            unsigned int x = __ldg(s + v);
            d[v] = make_float4(dequantize(x & 0xffu, scale, bias), dequantize((x >> 8) & 0xffu, scale, bias),
                               dequantize((x >> 16) & 0xffu, scale, bias), dequantize(x >> 24, scale, bias));
        }
    } else {
        for (int j = lane; j < dim; j += lanes) dst[j] = dequantize(src[j], scale, bias);
    }
}

extern "C" __global__ void embedding_gather(const long long* __restrict__ ids,
                                            const int* __restrict__ field_tables,
                                            int fields,
                                            const TableDesc* __restrict__ tables,
                                            long long n,
                                            int dim,
                                            int lanes_log2,
                                            int device,
                                            float* __restrict__ out) {
    const int lanes = 1 << lanes_log2;
    const int lane = threadIdx.x & (lanes - 1);
    const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> lanes_log2;
    const long long stride = ((long long)gridDim.x * blockDim.x) >> lanes_log2;
    for (long long p = first; p < n; p += stride) {
        const TableDesc* t = tables + field_tables[p % fields];
        const long long id = ids[p];
        float* dst = out + p * dim;
        long long row;
        if (id >= 0 && id < t->rows) {
            row = id;
        } else if (t->default_row >= 0) {
            row = t->default_row;
        } else {
            if (device == 0) {
                for (int j = lane; j < dim; j += lanes) dst[j] = __int_as_float(0x7fc00000);
            }
            continue;
        }
        const long long shard = row / t->rows_per_shard;
        const long long local = row - shard * t->rows_per_shard;
        const Shard s = t->shards[shard];
        if (s.device != device) continue;
        const unsigned char* src = s.data + local * (long long)t->row_bytes;
        switch (t->storage) {
            case STORAGE_FP32:
                copy_fp32(src, dst, dim, lane, lanes);
                break;
            case STORAGE_FP16:
                copy_fp16(src, dst, dim, lane, lanes);
                break;
            default:
                copy_int8(src, dst, dim, lane, lanes);
                break;
        }
    }
}
