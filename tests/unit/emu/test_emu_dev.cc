/* test_emu_dev.cc — white-box checks of cuda/dev.cu itself on the emulated device: the file
 * is compiled whole into this test, as libddpd-cuda-emu.so compiles it (emu/dev.cc), so its
 * static ops can be called with states that no caller through dev.h reaches. worker_die is
 * this file's: it records the message and jumps back instead of ending the process.
 * Issue 34, item 7: to_device leaves a launch error that is pending for the caller's check
 * (it cleared the runtime's last error on every call); batchnorm's size check says what is
 * wrong with a negative size (it said "a channel count over 2^31-1", and let a negative
 * channel count through). */
#include <setjmp.h>
#include <stdarg.h>

#include "dev.cc"

static int checks, failures;

#define EXPECT(cond, ...)                                                                                    \
    do {                                                                                                     \
        checks++;                                                                                            \
        if (!(cond)) {                                                                                       \
            failures++;                                                                                      \
            fprintf(stderr, "%s:%d: FAILED: ", __FILE__, __LINE__);                                          \
            fprintf(stderr, __VA_ARGS__);                                                                    \
            fputc('\n', stderr);                                                                             \
        }                                                                                                    \
    } while (0)

static jmp_buf died_at;
static char died[1024];

extern "C" [[noreturn]] void worker_die(ddpd_err code, const char *fmt, ...)
{
    (void)code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(died, sizeof died, fmt, ap);
    va_end(ap);
    longjmp(died_at, 1);
}

extern "C" ddpd_err ddpd_error_set(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt,
                                   ...)
{
    if (!e)
        return code;
    memset(e, 0, sizeof *e);
    e->code = code;
    snprintf(e->path, sizeof e->path, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return code;
}

/* Runs `call`; the message it died with, or "" when it returned. */
#define DIES(call)                                                                                           \
    ([&]() -> const char * {                                                                                 \
        died[0] = '\0';                                                                                      \
        if (setjmp(died_at) == 0)                                                                            \
            call;                                                                                            \
        return died;                                                                                         \
    }())

static void test_to_device_keeps_a_pending_launch_error(struct cuda *c)
{
    float *d = (float *)cu_alloc(c, 4 * sizeof(float));
    const float host[4] = {1, 2, 3, 4};
    /* A launch that fails at launch time (an empty grid): its error waits for the caller. */
    LAUNCH(k_fill, 0u, THREADS, 0, c->stream, d, 1.0f, (int64_t)4);
    cu_to_device(c, d, host, sizeof host); /* pageable memory: the attribute query succeeds */
    const cudaError_t e = cudaGetLastError();
    EXPECT(e == cudaErrorInvalidConfiguration, "the launch's error must survive to_device: got %s",
           cudaGetErrorName(e));
    float back[4] = {0, 0, 0, 0};
    cu_to_host(c, back, d, sizeof back);
    EXPECT(back[3] == 4.0f, "to_device copied %g, not 4", back[3]);
    cu_free(c, d);
}

static void test_batchnorm_sizes_say_what_is_wrong(struct cuda *c)
{
    const char *m = DIES(
        cu_batchnorm_forward_train(c, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, -1, 3, 4, 1e-5, 0.1));
    EXPECT(strstr(m, "batchnorm_forward_train") && strstr(m, "a negative size: batch -1, channels 3") &&
               !strstr(m, "2^31"),
           "a negative batch: %s", m);
    m = DIES(cu_batchnorm_forward_eval(c, NULL, NULL, NULL, NULL, NULL, NULL, 2, -3, 4, 1e-5));
    EXPECT(strstr(m, "a negative size: batch 2, channels -3, spatial size 4"), "negative channels: '%s'", m);
    m = DIES(cu_batchnorm_backward(c, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 2, 3, -2));
    EXPECT(strstr(m, "batchnorm_backward") && strstr(m, "spatial size -2"), "a negative spatial size: %s", m);
    m = DIES(
        cu_batchnorm_forward_eval(c, NULL, NULL, NULL, NULL, NULL, NULL, 1, (int64_t)INT32_MAX + 1, 1, 1e-5));
    EXPECT(strstr(m, "2147483648 channels, over 2^31-1"), "too many channels: %s", m);
    m = DIES(cu_batchnorm_forward_eval(c, NULL, NULL, NULL, NULL, NULL, NULL, 0, 3, 4, 1e-5));
    EXPECT(!*m, "an empty batch is no error: %s", m);
}

int main(void)
{
    setenv("DDPD_CUDA_EMU", "1", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    struct ddpd_error err;
    struct dev d = cuda__dev_new(0, false, &err);
    if (!d.ops) {
        fprintf(stderr, "cuda__dev_new: %s\n", err.message);
        return 1;
    }
    struct cuda *c = (struct cuda *)d.ctx;
    test_to_device_keeps_a_pending_launch_error(c);
    test_batchnorm_sizes_say_what_is_wrong(c);
    cuda__dev_free(d);
    fprintf(stderr, "%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
