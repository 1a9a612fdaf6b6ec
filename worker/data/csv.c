/* data/csv.c — the CSV reader of the data sets (CONTRACT.md §2): RFC 4180 fields, the
 * column layout the spec names, numbers parsed and checked cell by cell with the line and
 * column of any error. */
#include "data_impl.h"

#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/check.h"

#define CSV_MAX_CELL 256 /* a number longer than this is not a number */
#define CSV_MAX_COLS (SPEC_MAX_WIDTH + SPEC_MAX_TARGETS)

/* ---- CSV ---- */

struct csv {
    const char *p, *end;
    int64_t line;     /* physical line of p, 1-based */
    int64_t err_line; /* where CSV_ERR was found, and what */
    const char *err_what;
};

struct cell {
    const char *p; /* raw text, without the surrounding quotes */
    size_t len;
    bool escaped; /* holds "" pairs */
};

enum { CSV_MORE, CSV_EOR, CSV_ERR };

/* Ends a field at c->p: ',' (more fields follow), a line end or the end of the file. */
static int csv_after(struct csv *c)
{
    if (c->p >= c->end)
        return CSV_EOR;
    if (*c->p == ',') {
        c->p++;
        return CSV_MORE;
    }
    if (*c->p == '\n') {
        c->p++;
        c->line++;
        return CSV_EOR;
    }
    if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n') {
        c->p += 2;
        c->line++;
        return CSV_EOR;
    }
    return CSV_ERR;
}

/* Reads one field (RFC 4180). On CSV_ERR sets c->err_line and c->err_what. */
static int csv_field(struct csv *c, struct cell *out)
{
    out->escaped = false;
    if (c->p < c->end && *c->p == '"') {
        int64_t line0 = c->line;
        out->p = ++c->p;
        for (;;) {
            if (c->p >= c->end) {
                c->err_line = line0;
                c->err_what = "quoted field is never closed";
                return CSV_ERR;
            }
            if (*c->p == '"') {
                if (c->p + 1 < c->end && c->p[1] == '"') {
                    out->escaped = true;
                    c->p += 2;
                    continue;
                }
                break;
            }
            if (*c->p == '\n')
                c->line++;
            c->p++;
        }
        out->len = (size_t)(c->p - out->p);
        c->p++;
        int r = csv_after(c);
        if (r == CSV_ERR) {
            c->err_line = c->line;
            c->err_what = "unexpected character after a closing quote";
        }
        return r;
    }
    out->p = c->p;
    while (c->p < c->end && *c->p != ',' && *c->p != '\n') {
        if (*c->p == '"') {
            c->err_line = c->line;
            c->err_what = "quote inside an unquoted field";
            return CSV_ERR;
        }
        if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n')
            break;
        c->p++;
    }
    out->len = (size_t)(c->p - out->p);
    return csv_after(c);
}

/* Skips blank lines; false at the end of the file. */
static bool csv_next_record(struct csv *c)
{
    for (;;) {
        if (c->p >= c->end)
            return false;
        if (*c->p == '\n') {
            c->p++;
            c->line++;
        } else if (*c->p == '\r' && c->p + 1 < c->end && c->p[1] == '\n') {
            c->p += 2;
            c->line++;
        } else {
            return true;
        }
    }
}

/* The cell's text with "" unescaped, truncated to cap-1 bytes; returns its full length. */
static size_t cell_text(const struct cell *cl, char *out, size_t cap)
{
    size_t o = 0, n = 0;
    for (size_t i = 0; i < cl->len; i++, n++) {
        if (cl->escaped && cl->p[i] == '"')
            i++; /* the first of a "" pair */
        if (o + 1 < cap)
            out[o++] = cl->p[i];
    }
    if (cap)
        out[o] = '\0';
    return n;
}

/* An EDATA error at `line` (and 1-based column `col`, or 0) of a CSV file, which the
 * message names too. */
static ddpd_err csv_fail(struct ddpd_error *err, const char *name, int64_t line, int col, const char *fmt,
                         ...) __attribute__((format(printf, 5, 6)));
static ddpd_err csv_fail(struct ddpd_error *err, const char *name, int64_t line, int col, const char *fmt,
                         ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddpd_error_set(err, DDPD_EDATA, name, "%s: %s", name, msg);
    if (err) {
        err->line = (int)(line > INT_MAX ? INT_MAX : line);
        err->column = col;
    }
    return DDPD_EDATA;
}

/* Reads a cell's text with "" unescaped, a byte at a time. */
struct cell_reader {
    const struct cell *cl;
    size_t i;
};

/* The next byte, or -1 at the end of the text. */
static int cell_next(struct cell_reader *r)
{
    if (r->i >= r->cl->len)
        return -1;
    if (r->cl->escaped && r->cl->p[r->i] == '"')
        r->i++; /* the first of a "" pair */
    return (unsigned char)r->cl->p[r->i++];
}

/* Two cells' unescaped texts, whole however long, in byte order (strcmp's sign). */
static int cell_cmp(const struct cell *a, const struct cell *b)
{
    struct cell_reader ra = {a, 0}, rb = {b, 0};
    for (;;) {
        int x = cell_next(&ra), y = cell_next(&rb);
        if (x != y || x < 0)
            return x < y ? -1 : x > y;
    }
}

/* A header column for sorting the names: its cell and its 0-based position. */
struct named_col {
    const struct cell *cl;
    int col;
};

/* By name, then by position. */
static int named_col_cmp(const void *pa, const void *pb)
{
    const struct named_col *a = pa, *b = pb;
    int c = cell_cmp(a->cl, b->cl);
    return c ? c : a->col < b->col ? -1 : a->col > b->col;
}

/* The header's names (`ncols` cells of the header at `line`) must be distinct: pandas
 * would rename a repeated "b" to "b.1", so two tools would read different columns under
 * one name. Sorted, so the widest headers cost n log n. EDATA naming the two columns of
 * the earliest repeat (the repeating column with the lowest position, and the column it
 * repeats). */
static ddpd_err csv_unique_names(const char *name, const struct cell *names, int ncols, int64_t line,
                                 struct ddpd_error *err)
{
    struct named_col *v = malloc((size_t)(ncols > 0 ? ncols : 1) * sizeof *v);
    if (!v)
        return data__fail(err, DDPD_ENOMEM, name, "out of memory");
    for (int j = 0; j < ncols; j++)
        v[j] = (struct named_col){&names[j], j};
    qsort(v, (size_t)ncols, sizeof *v, named_col_cmp);
    /* Equal names sort by position: the first two of a run are a column and its first
     * repeat. */
    int first = -1, again = -1;
    for (int j = 1, start = 0; j < ncols; j++) {
        if (cell_cmp(v[j - 1].cl, v[j].cl) != 0)
            start = j;
        else if (j == start + 1 && (again < 0 || v[j].col < again)) {
            first = v[start].col;
            again = v[j].col;
        }
    }
    free(v);
    if (again < 0)
        return DDPD_OK;
    char text[64];
    size_t n = cell_text(&names[first], text, sizeof text);
    return csv_fail(err, name, line, again + 1,
                    "line %" PRId64 " (the header): columns %d and %d are both named \"%s%s\"; the "
                    "header's names must be distinct",
                    line, first + 1, again + 1, text, n >= sizeof text ? "..." : "");
}

/* The CSV's layout: the header's names and what each column feeds. */
struct csv_layout {
    int ncols;
    struct cell *names; /* [ncols] */
    int32_t *role;      /* [ncols]: >= 0 input index, < 0 target -(k+1) */
    int64_t rows;
    const char *body; /* first byte after the header */
    int64_t body_line;
};

static void layout_free(struct csv_layout *lo)
{
    free(lo->names);
    free(lo->role);
    lo->names = NULL;
    lo->role = NULL;
}

/* Reads the header, maps columns to inputs and targets and counts the data rows,
 * checking every row has the header's number of fields. */
static ddpd_err csv_scan(const char *name, const char *buf, int64_t len, const struct spec *s, bool empty_ok,
                         struct csv_layout *lo, struct ddpd_error *err)
{
    struct csv c = {buf, buf + len, 1, 0, NULL};
    char text[CSV_MAX_CELL];
    const struct spec_data *d = &s->data;
    int fi = data__first_linear(s), li = data__last_linear(s);
    int64_t in = s->layers[fi].in, out = s->layers[li].out;
    bool ce = s->loss == LOSS_CROSS_ENTROPY;
    int cap = 64, r;

    memset(lo, 0, sizeof *lo);
    if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0)
        c.p += 3; /* a UTF-8 byte order mark, as spreadsheets write */
    if (d->n_targets < 1 || d->n_targets > SPEC_MAX_TARGETS)
        return data__fail(err, DDPD_ESPEC, "data.target", "name the target column(s)");
    if (ce && d->n_targets != 1)
        return data__fail(err, DDPD_ESPEC, "data.target",
                          "cross_entropy needs exactly one target column (of class ids), got %d",
                          d->n_targets);
    if (!ce && d->n_targets != out)
        return data__fail(err, DDPD_ESPEC, "data.target", "%d target column(s) but model[%d].out is %" PRId64,
                          d->n_targets, li, out);
    if (!csv_next_record(&c))
        return data__fail(err, DDPD_EDATA, name, "empty file (a header row is needed)");
    const int64_t header_line = c.line;

    lo->names = malloc((size_t)cap * sizeof *lo->names);
    if (!lo->names)
        return data__fail(err, DDPD_ENOMEM, name, "out of memory");
    do {
        if (lo->ncols == cap) {
            if (cap >= CSV_MAX_COLS)
                return data__fail(err, DDPD_EDATA, name, "too many columns (the limit is %d)", CSV_MAX_COLS);
            cap *= 2;
            struct cell *nn = realloc(lo->names, (size_t)cap * sizeof *nn);
            if (!nn)
                return data__fail(err, DDPD_ENOMEM, name, "out of memory");
            lo->names = nn;
        }
        r = csv_field(&c, &lo->names[lo->ncols++]);
        if (r == CSV_ERR)
            return csv_fail(err, name, c.err_line, 0, "line %" PRId64 ": %s", c.err_line, c.err_what);
    } while (r == CSV_MORE);
    lo->body = c.p;
    lo->body_line = c.line;
    ddpd_err rc = csv_unique_names(name, lo->names, lo->ncols, header_line, err);
    if (rc)
        return rc;

    lo->role = malloc((size_t)lo->ncols * sizeof *lo->role);
    if (!lo->role)
        return data__fail(err, DDPD_ENOMEM, name, "out of memory");
    for (int j = 0; j < lo->ncols; j++)
        lo->role[j] = 0;
    for (int k = 0; k < d->n_targets; k++) { /* the names are distinct: at most one hit */
        int hits = 0;
        for (int j = 0; j < lo->ncols; j++) {
            size_t n = cell_text(&lo->names[j], text, sizeof text);
            if (n == strlen(d->targets[k]) && strcmp(text, d->targets[k]) == 0) {
                if (lo->role[j] < 0)
                    return data__fail(err, DDPD_ESPEC, "data.target", "\"%s\" is named twice", d->targets[k]);
                lo->role[j] = -(k + 1);
                hits++;
            }
        }
        if (hits == 0)
            return data__fail(err, DDPD_EDATA, name, "no column named \"%s\" (the target) in the header",
                              d->targets[k]);
    }
    int32_t inputs = 0;
    for (int j = 0; j < lo->ncols; j++)
        if (lo->role[j] == 0)
            lo->role[j] = inputs++;
    if (inputs != in)
        return data__fail(err, DDPD_EDATA, name,
                          "%d input columns (all but the target%s) but model[%d].in is %" PRId64, inputs,
                          d->n_targets > 1 ? "s" : "", fi, in);

    while (csv_next_record(&c)) {
        int64_t line = c.line;
        int n = 0;
        struct cell cl;
        do {
            r = csv_field(&c, &cl);
            if (r == CSV_ERR)
                return csv_fail(err, name, c.err_line, 0, "line %" PRId64 ": %s", c.err_line, c.err_what);
            n++;
        } while (r == CSV_MORE && n <= lo->ncols);
        if (n > lo->ncols)
            return csv_fail(err, name, line, 0, "line %" PRId64 " has more fields than the header's %d", line,
                            lo->ncols);
        if (n < lo->ncols)
            return csv_fail(err, name, line, 0, "line %" PRId64 " has %d fields but the header has %d", line,
                            n, lo->ncols);
        lo->rows++;
    }
    if (lo->rows == 0 && !empty_ok) /* empty_ok: a {rank} file, as for npy_check */
        return data__fail(err, DDPD_EDATA, name, "no data rows after the header");
    return DDPD_OK;
}

/* Parses a numeric cell: surrounding spaces allowed, the rest must be a finite decimal
 * number that float32 holds. Hexadecimal is refused, and so is whatever strtod reads as
 * NaN or infinity ("nan", "-Inf", "infinity", "nan(12)", any case) or as a value past
 * float32's range ("1e39"): pandas would read them, but the first batch that holds one
 * makes the loss NaN, and the job fails at that step. The planner and the rank that
 * loads a {rank} file run this same check, so it is found at submit where it can be. */
static ddpd_err csv_number(const char *name, const struct csv_layout *lo, int col, int64_t line,
                           const struct cell *cl, double *v, struct ddpd_error *err)
{
    char text[CSV_MAX_CELL], shown[48], col_name[64];
    size_t n = cell_text(cl, text, sizeof text);
    cell_text(&lo->names[col], col_name, sizeof col_name);
    snprintf(shown, sizeof shown, "%.40s%s", text, strlen(text) > 40 ? "..." : "");
    char *b = text, *e = text;
    while (*b == ' ' || *b == '\t')
        b++;
    size_t bl = strlen(b);
    while (bl && (b[bl - 1] == ' ' || b[bl - 1] == '\t'))
        b[--bl] = '\0';
    if (bl == 0)
        return csv_fail(err, name, line, col + 1, "line %" PRId64 ", column \"%s\": empty cell", line,
                        col_name);
    errno = 0;
    *v = n < sizeof text && !strpbrk(b, "xX") ? strtod(b, &e) : 0;
    if (n >= sizeof text || strpbrk(b, "xX") || e == b || *e)
        return csv_fail(err, name, line, col + 1, "line %" PRId64 ", column \"%s\": \"%s\" is not a number",
                        line, col_name, shown);
    if (errno == ERANGE && fabs(*v) > 1)
        return csv_fail(err, name, line, col + 1, "line %" PRId64 ", column \"%s\": \"%s\" is out of range",
                        line, col_name, shown);
    if (!isfinite(*v))
        return csv_fail(err, name, line, col + 1,
                        "line %" PRId64 ", column %d (\"%s\"): \"%s\" is not a finite number (NaN and "
                        "infinity make the loss NaN at the first step that reads them)",
                        line, col + 1, col_name, shown);
    if (!isfinite(data__to_f32(*v)))
        return csv_fail(err, name, line, col + 1,
                        "line %" PRId64 ", column %d (\"%s\"): \"%s\" is beyond float32's range (about "
                        "3.4e38), so it would be infinity",
                        line, col + 1, col_name, shown);
    return DDPD_OK;
}

/* Second pass, over a file csv_scan accepted: every cell into x, y or labels (or, with
 * those NULL, every cell checked: numbers, class ids in range). */
static ddpd_err csv_fill(const char *name, const char *buf, int64_t len, const struct csv_layout *lo,
                         struct dataset *ds, struct ddpd_error *err)
{
    struct csv c = {lo->body, buf + len, lo->body_line, 0, NULL};
    struct cell cl;
    ddpd_err rc;
    for (int64_t row = 0; csv_next_record(&c); row++) {
        int64_t line = c.line;
        for (int j = 0; j < lo->ncols; j++) {
            double v = 0;
            char col_name[64];
            if (NEVER(csv_field(&c, &cl) == CSV_ERR)) /* csv_scan parsed it */
                return csv_fail(err, name, c.err_line, 0, "line %" PRId64 ": %s", c.err_line, c.err_what);
            if ((rc = csv_number(name, lo, j, line, &cl, &v, err)))
                return rc;
            int32_t role = lo->role[j];
            if (role >= 0) {
                if (ds->x)
                    ds->x[row * ds->xn + role] = data__to_f32(v);
                continue;
            }
            if (!ds->ce) {
                if (ds->y)
                    ds->y[row * ds->yn + (-role - 1)] = data__to_f32(v);
                continue;
            }
            cell_text(&lo->names[j], col_name, sizeof col_name);
            if (v != floor(v))
                return csv_fail(err, name, line, j + 1,
                                "line %" PRId64 ", column \"%s\": class id %g is not an integer", line,
                                col_name, v);
            if (v < 0 || v >= (double)ds->classes)
                return csv_fail(err, name, line, j + 1,
                                "line %" PRId64 ", column \"%s\": class id %.0f is out of range "
                                "[0, %" PRId64 ")",
                                line, col_name, v, ds->classes);
            if (ds->labels)
                ds->labels[row] = (int32_t)v;
        }
    }
    return DDPD_OK;
}

ddpd_err data__csv_open(struct dataset *ds, const struct spec *s, const char *data_dir,
                        struct ddpd_error *err)
{
    struct dfile f = {.fd = -1};
    struct csv_layout lo = {0};
    char *buf = NULL;
    ddpd_err rc;
    ds->hold = data__has_rank(s->data.path) ? HOLD_PER_RANK : HOLD_WHOLE;
    if ((rc = data__file_open_fp(ds, &f, data_dir, "data.path", s->data.path, err)) ||
        (rc = data__read_whole(&f, &buf, err)) ||
        (rc = csv_scan(f.name, buf, f.size, s, ds->hold == HOLD_PER_RANK, &lo, err)) ||
        (rc = data__alloc_rows(ds, lo.rows, DDPD_EDATA, f.name, err)) ||
        (rc = csv_fill(f.name, buf, f.size, &lo, ds, err)))
        goto out;
    ds->n_total = lo.rows;
out:
    layout_free(&lo);
    free(buf);
    data__file_close(&f);
    return rc;
}

ddpd_err data__csv_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                        int64_t *file_bytes, struct ddpd_error *err)
{
    struct dfile f = {.fd = -1};
    struct csv_layout lo = {0};
    char *buf = NULL;
    ddpd_err rc;
    if ((rc = data__file_open(&f, data_dir, "data.path", s->data.path, 0, err)) ||
        (rc = data__read_whole(&f, &buf, err)) || (rc = csv_scan(f.name, buf, f.size, s, false, &lo, err)))
        goto out;
    *rows = lo.rows;
    *file_bytes = f.size;
    if (check) {
        bool ce = s->loss == LOSS_CROSS_ENTROPY;
        int64_t out = s->layers[data__last_linear(s)].out;
        struct dataset cells = {
            .xn = s->layers[data__first_linear(s)].in, .yn = ce ? 1 : out, .classes = out, .ce = ce};
        rc = csv_fill(f.name, buf, f.size, &lo, &cells, err);
    }
out:
    layout_free(&lo);
    free(buf);
    data__file_close(&f);
    return rc;
}
