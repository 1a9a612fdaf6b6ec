/* api_pytorch.c — GET /v1/jobs/{id}/pytorch: the job's model as PyTorch source (model.py,
 * pytorch.h), generated from its stored spec on each request. The weights are the
 * /checkpoint route's; this route serves only code, the same for every step. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../schema/spec.h"
#include "api_impl.h"
#include "http.h"
#include "pytorch.h"
#include "store.h"

ddpd_err api__pytorch(struct http_request *req, struct ddpd_error *err)
{
    int64_t id = http_request_id(req, 0);
    struct store_job j;
    struct spec *s = NULL;
    char *text = NULL;
    ddpd_err rc = api__get_job(req, &j, err);
    if (rc)
        goto out;
    if (!(s = malloc(sizeof *s))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory reading job %" PRId64 "'s spec", id);
        goto out;
    }
    /* The stored spec passed the validator when it was submitted. */
    struct ddpd_error pe = {0};
    if (spec_parse(j.spec ? j.spec : "", j.spec ? strlen(j.spec) : 0, NULL, s, &pe) != DDPD_OK) {
        rc = ddpd_error_set(err, DDPD_EINTERNAL, "", "job %" PRId64 "'s stored spec does not parse: %s: %s",
                            id, pe.path, pe.message);
        goto out;
    }
    if (!(text = pytorch_model_py(s, id))) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory writing job %" PRId64 "'s model.py", id);
        goto out;
    }
    http_response_header(req, "Content-Disposition", "attachment; filename=\"model.py\"");
    rc = http_respond_bytes(req, 200, "text/x-python; charset=utf-8", text, strlen(text));
out:
    free(text);
    free(s);
    store_job_clear(&j);
    return rc;
}
