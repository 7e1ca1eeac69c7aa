/*
 * colsum: column sums over rows (a bias's or a LayerNorm weight's gradient) that use the whole
 * GPU and keep a fixed order (launch.cuh, zs_colsum_begin/_end).
 *
 * Invariant: the sum of column c over N rows is ((chunk 0) + (chunk 1)) + ... in chunk order,
 * each chunk's ZS_COL_CHUNK rows (the last one shorter) added in row order from 0.0f: a fixed
 * function of N and the values, so the bits are the same run to run (and on any GPU: fp32 adds
 * only, no contraction with --fmad=false).  N <= ZS_COL_CHUNK is one chunk, written straight
 * into the output: the plain row-order sum.
 */
#include "kernels/cuda/launch.cuh"

/* out[c] = sum over k < chunks of sums[k * C + c], in k order: a thread a column. */
__global__ static void colsum_chunks_kernel(float *out, const float *sums, int chunks, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int k = 0; k < chunks; k++)
        acc += sums[(size_t)k * C + c];
    out[c] = acc;
}

int zs_colsum_chunks(int N)
{
    return N <= ZS_COL_CHUNK ? 1 : (N + ZS_COL_CHUNK - 1) / ZS_COL_CHUNK;
}

zs_err zs_colsum_begin(float *out, int N, int C, zs_cuda_stream stream, float **sums)
{
    *sums = out;
    int chunks = zs_colsum_chunks(N);
    if (!out || chunks == 1 || C == 0)
        return ZS_OK;
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, (size_t)chunks * C * sizeof(float), stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not the next kernel's failure */
        return zs_error(ZS_ERR_NOMEM, "cuda: %d x %d floats for column sums: %s", chunks, C,
                        cudaGetErrorString(e));
    }
    *sums = (float *)p;
    return ZS_OK;
}

zs_err zs_colsum_end(float *out, float *sums, int N, int C, zs_cuda_stream stream, zs_err launched)
{
    int chunks = zs_colsum_chunks(N);
    if (!out || sums == out || C == 0)
        return launched;
    zs_err e = launched;
    if (e == ZS_OK) {
        colsum_chunks_kernel<<<zs_cuda_blocks(C, ZS_CUDA_BLOCK), ZS_CUDA_BLOCK, 0, stream>>>(
            out, sums, chunks, C);
        e = zs_cuda_launched("column sums (chunks)", chunks, C);
    }
    cudaFreeAsync(sums, stream);
    return e;
}
