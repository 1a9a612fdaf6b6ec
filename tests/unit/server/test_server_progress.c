/* test_server_progress.c — server/progress.c: the total steps as the dashboard counts them
 * (steps, epochs of synthetic data, epochs from the start events' batches), and the line
 * drawn from a job's events: the mean loss of the latest step over the ranks, the latest
 * eval, samples/s over the ranks, the ETA from the events' times, the state; redrawn with
 * '\r', one newline at the end; a state from the network shown escaped. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/progress.h"

static json_t *js(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fprintf(stderr, "bad test JSON: %s: %s\n", text, e.text);
    return j;
}

static int64_t total(const char *spec, int64_t batches)
{
    json_t *j = js(spec);
    int64_t t = progress_total_steps(j, batches);
    json_decref(j);
    return t;
}

static void feed(struct progress *p, const char *ev)
{
    json_t *j = js(ev);
    progress_event(p, j);
    json_decref(j);
}

/* The text after the last '\r' of what was written (the line as a terminal shows it). */
static const char *last_line(const char *text)
{
    const char *r = strrchr(text, '\r');
    return r ? r + 1 : text;
}

int main(void)
{
    CHECK_EQ_INT(total("{\"steps\": 300, \"epochs\": 4}", 0), 300);
    /* 3000 samples over 2 ranks in batches of 4: rank 0 has 1500, 375 batches; 2 epochs of
     * 375/2 rounded up with grad_accum 2. */
    CHECK_EQ_INT(total("{\"epochs\": 2, \"grad_accum\": 2, \"world_size\": 2, \"batch_size\": 4, "
                       "\"data\": {\"type\": \"synthetic\", \"samples\": 3000}}",
                       0),
                 2 * 188);
    CHECK_EQ_INT(total("{\"epochs\": 1, \"world_size\": 3, \"batch_size\": 4, "
                       "\"data\": {\"type\": \"synthetic\", \"samples\": 10, \"drop_last\": true}}",
                       0),
                 1); /* rank 0: 4 samples, one full batch */
    CHECK_EQ_INT(total("{\"epochs\": 3, \"data\": {\"type\": \"npy\"}}", 0), 0);
    CHECK_EQ_INT(total("{\"epochs\": 3, \"grad_accum\": 2, \"data\": {\"type\": \"npy\"}}", 9), 15);
    CHECK_EQ_INT(total("null", 9), 0);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (!f)
        return 1;
    json_t *spec = js("{\"epochs\": 2, \"grad_accum\": 2, \"world_size\": 2, \"data\": {\"type\": \"npy\"}}");
    struct progress *p = progress_new(f, 7, spec, "queued");
    json_decref(spec);
    CHECK(p != NULL);
    if (!p)
        return 1;
    feed(p, "{\"event\":\"state\",\"state\":\"running\",\"ts\":999}");
    fflush(f);
    CHECK_EQ_STR(last_line(text), "job 7 running  step 0");
    feed(p, "{\"event\":\"start\",\"rank\":0,\"batches\":10,\"ts\":999.5}");
    feed(p, "{\"event\":\"start\",\"rank\":1,\"batches\":9,\"ts\":999.5}");
    feed(p, "{\"event\":\"loss\",\"rank\":0,\"step\":1,\"loss\":1.0,\"samples_per_s\":100,\"ts\":1000}");
    feed(p, "{\"event\":\"loss\",\"rank\":1,\"step\":1,\"loss\":3.0,\"samples_per_s\":50,\"ts\":1000}");
    feed(p, "{\"event\":\"loss\",\"rank\":0,\"step\":5,\"loss\":0.5,\"samples_per_s\":120,\"ts\":1004}");
    feed(p, "{\"event\":\"loss\",\"rank\":1,\"step\":5,\"loss\":1.5,\"samples_per_s\":60,\"ts\":1004}");
    feed(p, "{\"event\":\"eval\",\"rank\":0,\"step\":5,\"loss\":0.31,\"accuracy\":0.91,\"samples\":20,\"ts\":"
            "1004}");
    progress_flush(p); /* the last of a burst shows, however fast it came */
    fflush(f);
    CHECK_EQ_STR(last_line(text),
                 "job 7 running  step 5/10 (50%)  loss 1  eval 0.31 acc 91.0%  180 samples/s  ETA 0:05");
    len = strlen(text);
    progress_flush(p); /* nothing new: nothing drawn */
    fflush(f);
    CHECK_EQ_INT((int64_t)strlen(text), (int64_t)len);
    feed(p, "{\"event\":\"checkpoint\",\"rank\":0,\"step\":5,\"path\":\"x\",\"ts\":1004}"); /* no change */
    /* A state change draws at once; the same state again does not end the line. */
    feed(p, "{\"event\":\"state\",\"state\":\"running\",\"ts\":1004}");
    progress_set_state(p, "running");
    fflush(f);
    /* 2 epochs of ceil(10/2) steps; 1 s per step from step 1 to 5, 5 steps left. */
    CHECK_EQ_STR(last_line(text),
                 "job 7 running  step 5/10 (50%)  loss 1  eval 0.31 acc 91.0%  180 samples/s  ETA 0:05");
    CHECK(strchr(text, '\n') == NULL);

    /* A step where one rank's loss is not finite: the mean over the others. */
    feed(p,
         "{\"event\":\"loss\",\"rank\":0,\"step\":6,\"loss\":null,\"nonfinite\":true,\"samples_per_s\":120,"
         "\"ts\":1005}");
    feed(p, "{\"event\":\"loss\",\"rank\":1,\"step\":6,\"loss\":2.5,\"samples_per_s\":60,\"ts\":1005}");
    progress_set_state(p, "running");
    fflush(f);
    CHECK(strstr(last_line(text), "step 6/10 (60%)  loss 2.5  eval") != NULL);
    feed(p, "{\"event\":\"done\",\"rank\":0,\"steps\":10,\"loss\":0.1,\"seconds\":6,\"ts\":1009}");
    feed(p, "{\"event\":\"state\",\"state\":\"succeeded\",\"ts\":1010}");
    progress_finish(p);
    fflush(f);
    CHECK(len > 0 && text[len - 1] == '\n');
    text[len - 1] = '\0';
    CHECK_EQ_STR(last_line(text), "job 7 succeeded  step 10/10 (100%)  eval 0.31 acc 91.0%");
    /* A shorter line blanks what the longer one left: spaces, then the line again. */
    CHECK(strstr(text, "job 7 succeeded  step 10/10 (100%)  eval 0.31 acc 91.0%   ") != NULL);
    progress_free(p);
    fclose(f);
    free(text);

    /* A local run (job 0), loss all non-finite, unknown total. */
    text = NULL;
    f = open_memstream(&text, &len);
    p = progress_new(f, 0, NULL, NULL);
    feed(p, "{\"event\":\"loss\",\"rank\":0,\"step\":3,\"loss\":null,\"nonfinite\":true,\"samples_per_s\":0,"
            "\"ts\":1}");
    progress_finish(p);
    fflush(f);
    CHECK_EQ_STR(text + len - strlen("running  step 3  loss nan\n"), "running  step 3  loss nan\n");
    progress_free(p);
    progress_free(NULL);
    fclose(f);
    free(text);

    /* A state from the network with escape sequences (a screen clear, CSI as C1) is shown
     * escaped: the line holds no control character but its '\r' and '\n'. */
    text = NULL;
    f = open_memstream(&text, &len);
    p = progress_new(f, 9, NULL, "\x1b[2J");
    feed(p, "{\"event\":\"loss\",\"rank\":0,\"step\":1,\"loss\":2,\"samples_per_s\":0,\"ts\":1}");
    feed(p, "{\"event\":\"state\",\"state\":\"\\u001b]0;t\\u0007\\u009b\",\"ts\":1}");
    progress_finish(p);
    fflush(f);
    for (size_t i = 0; i < len; i++)
        if (((unsigned char)text[i] < 0x20 && text[i] != '\r' && text[i] != '\n') ||
            (unsigned char)text[i] == 0x7f ||
            ((unsigned char)text[i] == 0xc2 && (unsigned char)text[i + 1] < 0xa0))
            CHECK_EQ_INT((unsigned char)text[i], 0);
    CHECK(strstr(text, "job 9 \\x1b[2J  step 1") != NULL);
    CHECK(strstr(text, "job 9 \\x1b]0;t\\x07\\u009b  step 1") != NULL);
    progress_free(p);
    fclose(f);
    free(text);
    CHECK_DONE();
}
