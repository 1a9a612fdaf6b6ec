/* flood_worker.c — a fake ddpd-worker for bench/load-flood: one rank that floods its
 * stdout with `loss` events at a fixed rate, to see what the server does with a worker
 * that talks too much. Used only by the benchmark (DDPD_WORKER points the server at it).
 *
 *   flood_worker ARGS...  (--plan, --devices, --issue-id): execs the real worker,
 *                         $DDPD_FLOOD_REAL_WORKER, with the same arguments;
 *   flood_worker          (a rank): reads its stdin document, writes a `start` event,
 *                         then $DDPD_FLOOD_RATE loss events per second (default 100000)
 *                         for $DDPD_FLOOD_SECONDS (default 5) in 1 ms ticks, then a
 *                         `done` event whose steps/seconds is the rate it achieved (a
 *                         blocking stdout: when the server reads slower, the flood slows
 *                         down), and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_real(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double now_mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        const char *real = getenv("DDPD_FLOOD_REAL_WORKER");
        if (!real) {
            fprintf(stderr, "flood_worker: set DDPD_FLOOD_REAL_WORKER\n");
            return 1;
        }
        argv[0] = (char *)real;
        execv(real, argv);
        perror(real);
        return 127;
    }
    char buf[65536];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    const char *e = getenv("DDPD_FLOOD_RATE");
    double rate = e ? atof(e) : 100000, secs = (e = getenv("DDPD_FLOOD_SECONDS")) ? atof(e) : 5;
    static char out[1 << 20];
    setvbuf(stdout, out, _IOFBF, sizeof out);
    printf("{\"event\":\"start\",\"rank\":0,\"world_size\":1,\"device\":\"cpu\",\"params\":3,\"batches\":1,"
           "\"ts\":%.6f}\n",
           now_real());
    fflush(stdout);
    long step = 0;
    double t0 = now_mono(), end = t0 + secs;
    for (long tick = 1;; tick++) {
        double t = now_mono();
        if (t >= end)
            break;
        long want = (long)((t - t0) * rate);
        double ts = now_real();
        while (step < want) {
            step++;
            printf(
                "{\"event\":\"loss\",\"rank\":0,\"step\":%ld,\"epoch\":0,\"loss\":0.5,\"samples_per_s\":1.0,"
                "\"ts\":%.6f}\n",
                step, ts);
        }
        fflush(stdout);
        double next = t0 + tick * 0.001, left = next - now_mono();
        if (left > 0) {
            struct timespec s = {0, (long)(left * 1e9)};
            nanosleep(&s, NULL);
        }
    }
    double took = now_mono() - t0;
    printf("{\"event\":\"done\",\"rank\":0,\"steps\":%ld,\"loss\":0.5,\"seconds\":%.6f,\"ts\":%.6f}\n", step,
           took, now_real());
    fflush(stdout);
    fprintf(stderr, "flood_worker: %ld loss events in %.2f s (%.0f/s; asked for %.0f/s)\n", step, took,
            step / took, rate);
    return 0;
}
