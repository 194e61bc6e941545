/*
 * Real bodies for the few stub functions torch 2.11.0 calls on import or on first use and whose results it
 * reads (otel_ebpf/twin/stubs.py compiles each section into the stub it names; every other imported symbol
 * returns 0, the libraries' *_SUCCESS).  Prototypes follow the libraries' headers, simplified to C types of
 * the same size (handles are pointers, enums and status codes ints).
 */
/* @@ libcudnn.so.9 */
/* torch checks the cuDNN version it was built for (torch/backends/cudnn: 9.19 = 91900) */
size_t cudnnGetVersion(void) { return 91900; }
size_t cudnnGetCudartVersion(void) { return 13000; }
static int cudnn_handle[64];
long cudnnCreate(void **handle) { *handle = cudnn_handle; return 0; }
const char *cudnnGetErrorString(int status) { (void)status; return "otel-ebpf twin: stub cuDNN"; }
/* @@ libcublas.so.13 */
static int cublas_handle[64];
long cublasCreate_v2(void **handle) { *handle = cublas_handle; return 0; }
/* @@ libcublasLt.so.13 */
static int cublaslt_handle[64];
long cublasLtCreate(void **handle) { *handle = cublaslt_handle; return 0; }
size_t cublasLtGetVersion(void) { return 130000; }
/* cublasLtMatmulHeuristicResult_t (cublasLt.h 13.0): a 64-byte algo, workspaceSize, state, wavesCount, reserved */
struct lt_heuristic { unsigned long long algo[8]; size_t workspaceSize; int state; float wavesCount; int reserved[4]; };
/* one usable algorithm, so torch's matmul goes on (and launches nothing: the stub's matmul returns 0) */
long cublasLtMatmulAlgoGetHeuristic(void *h, void *op, void *a, void *b, void *c, void *d, void *pref, int requested,
                                    struct lt_heuristic *results, int *returned)
{
    (void)h; (void)op; (void)a; (void)b; (void)c; (void)d; (void)pref;
    if (requested > 0 && results != NULL) {
        memset(results, 0, sizeof(*results));
        results->wavesCount = 1.0f;
    }
    if (returned != NULL)
        *returned = requested > 0 ? 1 : 0;
    return 0;
}
/* @@ libcuda.so.1 */
/* The driver API (cuda.h 13.0): a primary context that is active, device ordinals as handles. */
long cuDevicePrimaryCtxGetState(int dev, unsigned *flags, int *active)
{
    (void)dev;
    if (flags != NULL) *flags = 0;
    if (active != NULL) *active = 1;
    return 0;
}
long cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
long cuDeviceGetAttribute(int *value, int attrib, int dev) { (void)attrib; (void)dev; *value = 0; return 0; }
long cuCtxGetCurrent(void **ctx) { static int context; *ctx = &context; return 0; }
long cuGetErrorString(int error, const char **text) { (void)error; *text = "otel-ebpf twin: stub libcuda"; return 0; }
