/* emu/cublas.cc — cuBLAS on the emulated device: cublasSgemm and its strided-batched form
 * as OpenBLAS's cblas_sgemm with CblasColMajor and the same transposes and leading
 * dimensions, queued on the handle's stream. The arguments are checked as cuBLAS checks
 * them (sizes, lda >= max(1, rows of op(A)), ...), and every operand's whole extent must be
 * device memory: a wrong leading dimension gives a wrong answer or an error naming the
 * operand, as it would on a GPU. TF32 math mode computes in float32 (emulation says nothing
 * about TF32). */
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "emu_impl.h"
#include "include/cublas_v2.h"

struct emu_cublas {
    cudaStream_t stream = NULL;
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace
{

const struct {
    cublasStatus_t code;
    const char *name, *text;
} statuses[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
};
constexpr int NSTATUS = (int)(sizeof statuses / sizeof statuses[0]);
std::atomic<const char *> detail[NSTATUS];

int status_index(cublasStatus_t s)
{
    for (int i = 0; i < NSTATUS; i++)
        if (statuses[i].code == s)
            return i;
    return 7; /* internal error */
}

/* A refused call: the reason on stderr and in cublasGetStatusString (never freed: another
 * thread may be printing the previous one). */
cublasStatus_t refuse(cublasStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t refuse(cublasStatus_t s, const char *fmt, ...)
{
    char why[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddpd cuda emulator: %s\n", why);
    const int i = status_index(s);
    const size_t cap = strlen(statuses[i].text) + strlen(why) + 40;
    char *text = (char *)malloc(cap);
    if (text) {
        snprintf(text, cap, "%s (ddpd cuda emulator: %s)", statuses[i].text, why);
        detail[i].store(text);
    }
    return s;
}

/* Operand X of a column-major product: op(X) is rows x cols, so X itself is stored as
 * (trans ? cols x rows : rows x cols) with leading dimension ld; over `batch` matrices
 * `stride` elements apart. Checks ld as cuBLAS does, then that the whole extent is device
 * memory. */
cublasStatus_t operand(const char *call, const char *name, const float *x, bool trans, int rows, int cols,
                       int ld, long long stride, int batch)
{
    const int srows = trans ? cols : rows, scols = trans ? rows : cols;
    if (ld < (srows > 1 ? srows : 1))
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "%s: ld%c = %d is less than max(1, %d), the rows of %s as stored", call, name[0] + 32,
                      ld, srows, name);
    if (srows == 0 || scols == 0)
        return CUBLAS_STATUS_SUCCESS;
    const size_t one = (size_t)ld * (size_t)(scols - 1) + (size_t)srows;
    const size_t elems = one + (batch > 1 ? (size_t)stride * (size_t)(batch - 1) : 0);
    if (emu_mem_kind(x, elems * sizeof(float)) != EMU_MEM_DEVICE) {
        char what[256];
        emu_mem_describe(x, what, sizeof what);
        return refuse(CUBLAS_STATUS_EXECUTION_FAILED,
                      "%s: %s (%d x %d stored, ld %d, %zu floats) is not all device memory: it starts at %s",
                      call, name, srows, scols, ld, elems, what);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                    int n, int k, const float *alpha, const float *a, int lda, long long sa, const float *b,
                    int ldb, long long sb, const float *beta, float *c, int ldc, long long sc, int batch)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T && ta != CUBLAS_OP_C) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T && tb != CUBLAS_OP_C))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: a transpose flag is not N, T or C", call);
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE,
                      "%s: m = %d, n = %d, k = %d, batch = %d: none may be negative", call, m, n, k, batch);
    if (!alpha || !beta)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha and beta are host pointers here", call);
    const bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
    cublasStatus_t s;
    if ((s = operand(call, "A", a, at, m, k, lda, sa, batch)) != CUBLAS_STATUS_SUCCESS ||
        (s = operand(call, "B", b, bt, k, n, ldb, sb, batch)) != CUBLAS_STATUS_SUCCESS ||
        (s = operand(call, "C", c, false, m, n, ldc, sc, batch)) != CUBLAS_STATUS_SUCCESS)
        return s;
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    /* alpha and beta are read now (host pointer mode); the product runs in stream order. */
    const float al = *alpha, be = *beta;
    cudaError_t e = emu::enqueue(h->stream, [=] {
        for (int i = 0; i < batch; i++) {
            float *ci = c + (size_t)i * (size_t)sc;
            if (k == 0) {
                /* C = beta C, and beta = 0 overwrites whatever C held, as BLAS does. */
                for (int j = 0; j < n; j++)
                    for (int r = 0; r < m; r++)
                        ci[(size_t)j * ldc + r] = be == 0.0f ? 0.0f : be * ci[(size_t)j * ldc + r];
                continue;
            }
            cblas_sgemm(CblasColMajor, at ? CblasTrans : CblasNoTrans, bt ? CblasTrans : CblasNoTrans, m, n,
                        k, al, a + (size_t)i * (size_t)sa, lda, b + (size_t)i * (size_t)sb, ldb, be, ci, ldc);
        }
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                            : refuse(CUBLAS_STATUS_EXECUTION_FAILED, "%s: %s", call, cudaGetErrorString(e));
}

} // namespace

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    if (emu_device_count() == 0)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new emu_cublas();
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* Work already queued holds no reference to the handle. */
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = h->mode;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s)
{
    const int i = status_index(s);
    const char *d = detail[i].load();
    return d ? d : statuses[i].text;
}

extern "C" const char *cublasGetStatusName(cublasStatus_t s)
{
    return statuses[status_index(s)].name;
}

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                      int n, int k, const float *alpha, const float *a, int lda,
                                      const float *b, int ldb, const float *beta, float *c, int ldc)
{
    return gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

extern "C" cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                                    cublasOperation_t tb, int m, int n, int k,
                                                    const float *alpha, const float *a, int lda, long long sa,
                                                    const float *b, int ldb, long long sb, const float *beta,
                                                    float *c, int ldc, long long sc, int batch)
{
    return gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc,
                sc, batch);
}
