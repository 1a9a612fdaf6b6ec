/* api_queue.c — GET /v1/queue: the running jobs and the pending ones in the order they
 * would start (docs/api.md "GET /v1/queue"), as the supervisor's view gives them
 * (super_queue). Reads only. */
#include <jansson.h>
#include <stdint.h>

#include "api_impl.h"
#include "http.h"
#include "super.h"

ddpd_err api__queue(struct http_request *req, struct ddpd_error *err)
{
    int64_t limit;
    ddpd_err rc =
        http_query_int(req, "limit", 1, SUPER_QUEUE_LIMIT_MAX, SUPER_QUEUE_LIMIT_DEFAULT, &limit, err);
    if (rc)
        return rc;
    json_t *q = super_queue(api__ctx(req)->super, (int)limit, err);
    if (!q)
        return err->code;
    return http_respond_json(req, 200, q);
}
