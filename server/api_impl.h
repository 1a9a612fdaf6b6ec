/* api_impl.h — what api.c shares with the api module's other files (api_*.c): the job
 * lookup their handlers start with, and the handlers they define for api.c's route table.
 * Only the api module's files include it. */
#ifndef DDPD_API_IMPL_H
#define DDPD_API_IMPL_H

#include "../schema/err.h"

struct http_request;
struct store_job;

/* Job `{id}` of the request's path into *j (zeroed first; the caller clears it with
 * store_job_clear). DDPD_ENOTFOUND when there is none. */
ddpd_err api__get_job(struct http_request *req, struct store_job *j, struct ddpd_error *err);

/* ---- the handlers of the route table (api.c) ---- */

ddpd_err api__pytorch(struct http_request *req, struct ddpd_error *err); /* api_pytorch.c */

#endif
