/* progress.c — the one-line progress display (progress.h): keeps what the events say about
 * the job (the latest step and its mean loss over the ranks, each rank's samples/s, the
 * latest eval, the state) and draws it on one terminal line. Writes nothing but that line. */
#include "progress.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "../base/clock.h"
#include "termsafe.h"

/* Ranks whose samples/s are added up; a bigger rank number is ignored for the sum. */
#define PROGRESS_RANKS 1024

struct progress {
    FILE *out;
    int64_t job, total, batches;
    int64_t step;            /* the latest step with a loss */
    double loss_sum;         /* over the ranks that reported `step` */
    int loss_n, nonfinite_n; /* ranks that reported `step`; those whose loss was not finite */
    double rate[PROGRESS_RANKS];
    bool have_eval, have_acc;
    double eval_loss, eval_acc;
    int64_t eval_step;
    /* The first loss event seen: where the ETA's rate is measured from. */
    int64_t step0;
    double ts0, ts_last;
    char state[16];
    json_t *spec;   /* a copy, for the total once the start events tell the batches */
    double drawn_s; /* when the line was last drawn (monotonic), 0: never */
    int width;      /* the last line's length, to blank what a shorter one leaves */
    bool dirty;     /* an event changed the line since it was drawn */
};

int64_t progress_total_steps(const json_t *spec, int64_t batches)
{
    if (!json_is_object(spec))
        return 0;
    json_int_t steps = json_integer_value(json_object_get(spec, "steps"));
    if (steps > 0)
        return steps;
    json_int_t epochs = json_integer_value(json_object_get(spec, "epochs"));
    json_int_t accum = json_integer_value(json_object_get(spec, "grad_accum"));
    if (accum < 1)
        accum = 1;
    if (batches <= 0) { /* synthetic data: rank 0 has the most samples */
        const json_t *data = json_object_get(spec, "data");
        json_int_t w = json_integer_value(json_object_get(spec, "world_size"));
        json_int_t b = json_integer_value(json_object_get(spec, "batch_size"));
        json_int_t samples = json_integer_value(json_object_get(data, "samples"));
        const char *type = json_string_value(json_object_get(data, "type"));
        if (!type || strcmp(type, "synthetic") || samples <= 0 || b <= 0)
            return 0;
        if (w < 1)
            w = 1;
        json_int_t n = (samples + w - 1) / w;
        batches = json_is_true(json_object_get(data, "drop_last")) ? n / b : (n + b - 1) / b;
    }
    if (epochs <= 0 || batches <= 0)
        return 0;
    return epochs * ((batches + accum - 1) / accum);
}

struct progress *progress_new(FILE *out, int64_t job, const json_t *spec, const char *state)
{
    struct progress *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->out = out;
    p->job = job;
    p->spec = spec ? json_deep_copy(spec) : NULL;
    p->total = progress_total_steps(spec, 0);
    p->step0 = -1;
    snprintf(p->state, sizeof p->state, "%s", state ? state : "");
    return p;
}

void progress_free(struct progress *p)
{
    if (!p)
        return;
    json_decref(p->spec);
    free(p);
}

void progress_line(FILE *out, char *line, int *width, bool final)
{
    size_t n = strlen(line);
    /* A line wider than the terminal wraps, and '\r' goes back to the start of its last
     * row only: cut it to the width (less one column, where some terminals wrap early). */
    struct winsize ws;
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && n > (size_t)ws.ws_col - 1) {
        n = (size_t)ws.ws_col - 1;
        line[n] = '\0';
    }
    int pad = *width > (int)n ? *width - (int)n : 0;
    fprintf(out, "\r%s", line);
    if (pad) /* blank what a longer line left, and put the cursor back after the text */
        fprintf(out, "%*s\r%s", pad, "", line);
    if (final)
        fputc('\n', out);
    fflush(out);
    *width = (int)n;
}

/* "1:02:03", "4:05" or "—" for seconds. */
static void fmt_duration(char *buf, size_t cap, double s)
{
    if (!(s >= 0) || s > 1e8) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

static void draw(struct progress *p, bool final)
{
    char line[512];
    size_t n = 0;
#define ADD(...)                                                                                             \
    do {                                                                                                     \
        if (n < sizeof line)                                                                                 \
            n += (size_t)snprintf(line + n, sizeof line - n, __VA_ARGS__);                                   \
    } while (0)
    if (p->job > 0)
        ADD("job %lld ", (long long)p->job);
    char st[sizeof p->state * 4]; /* the state comes from the events: shown escaped */
    ADD("%s", p->state[0] ? termsafe_line(st, sizeof st, p->state) : "waiting");
    if (p->total > 0)
        ADD("  step %lld/%lld (%.0f%%)", (long long)p->step, (long long)p->total,
            100.0 * (double)(p->step < p->total ? p->step : p->total) / (double)p->total);
    else
        ADD("  step %lld", (long long)p->step);
    if (p->loss_n > p->nonfinite_n)
        ADD("  loss %.4g", p->loss_sum / (p->loss_n - p->nonfinite_n));
    else if (p->nonfinite_n)
        ADD("  loss nan");
    if (p->have_eval) {
        ADD("  eval %.4g", p->eval_loss);
        if (p->have_acc)
            ADD(" acc %.1f%%", 100.0 * p->eval_acc);
    }
    double rate = 0;
    for (int r = 0; r < PROGRESS_RANKS; r++)
        rate += p->rate[r];
    if (rate > 0)
        ADD("  %.0f samples/s", rate);
    if (!final && p->total > 0 && p->step0 >= 0 && p->step > p->step0 && p->ts_last > p->ts0 &&
        p->step < p->total) {
        char eta[32];
        double per_step = (p->ts_last - p->ts0) / (double)(p->step - p->step0);
        fmt_duration(eta, sizeof eta, per_step * (double)(p->total - p->step));
        ADD("  ETA %s", eta);
    }
#undef ADD
    progress_line(p->out, line, &p->width, final);
    p->drawn_s = base_mono_s();
    p->dirty = false;
}

static double num(const json_t *ev, const char *key)
{
    return json_number_value(json_object_get(ev, key));
}

void progress_event(struct progress *p, const json_t *ev)
{
    const char *kind = json_string_value(json_object_get(ev, "event"));
    if (!kind)
        return;
    json_int_t rank = json_integer_value(json_object_get(ev, "rank"));
    bool force = false;
    if (!strcmp(kind, "loss")) {
        int64_t step = json_integer_value(json_object_get(ev, "step"));
        double ts = num(ev, "ts");
        if (step > p->step) {
            p->step = step;
            p->loss_sum = 0;
            p->loss_n = p->nonfinite_n = 0;
        }
        if (step == p->step) {
            const json_t *l = json_object_get(ev, "loss");
            p->loss_n++;
            if (json_is_number(l) && isfinite(json_number_value(l)))
                p->loss_sum += json_number_value(l);
            else
                p->nonfinite_n++;
        }
        if (rank >= 0 && rank < PROGRESS_RANKS)
            p->rate[rank] = num(ev, "samples_per_s");
        if (p->step0 < 0) {
            p->step0 = step;
            p->ts0 = ts;
        }
        if (ts > p->ts_last)
            p->ts_last = ts;
        if (!p->state[0] || !strcmp(p->state, "starting"))
            snprintf(p->state, sizeof p->state, "running");
    } else if (!strcmp(kind, "eval")) {
        p->have_eval = true;
        p->eval_loss = num(ev, "loss");
        p->have_acc = json_is_number(json_object_get(ev, "accuracy"));
        p->eval_acc = num(ev, "accuracy");
        p->eval_step = json_integer_value(json_object_get(ev, "step"));
    } else if (!strcmp(kind, "start")) {
        int64_t b = json_integer_value(json_object_get(ev, "batches"));
        if (b > p->batches) {
            p->batches = b;
            int64_t t = progress_total_steps(p->spec, b);
            if (t > 0)
                p->total = t;
        }
    } else if (!strcmp(kind, "join") || !strcmp(kind, "done")) {
        int64_t step = json_integer_value(json_object_get(ev, !strcmp(kind, "done") ? "steps" : "step"));
        if (step > p->step) {
            p->step = step;
            p->loss_sum = 0;
            p->loss_n = p->nonfinite_n = 0;
        }
        if (!strcmp(kind, "done") && rank >= 0 && rank < PROGRESS_RANKS)
            p->rate[rank] = 0;
    } else if (!strcmp(kind, "state")) {
        const char *st = json_string_value(json_object_get(ev, "state"));
        if (st && strcmp(st, p->state)) {
            snprintf(p->state, sizeof p->state, "%s", st);
            if (strcmp(st, "running"))
                memset(p->rate, 0, sizeof p->rate);
            force = true;
        }
    } else {
        return;
    }
    p->dirty = true;
    if (force || !p->drawn_s || base_mono_s() - p->drawn_s >= 0.1)
        draw(p, false);
}

void progress_flush(struct progress *p)
{
    if (p->dirty)
        draw(p, false);
}

void progress_set_state(struct progress *p, const char *state)
{
    snprintf(p->state, sizeof p->state, "%s", state ? state : "");
    draw(p, false);
}

void progress_finish(struct progress *p)
{
    draw(p, true);
}
