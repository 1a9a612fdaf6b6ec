/* api_impl.h — what api.c shares with the api module's other files (api_*.c): the job
 * lookup their handlers start with, and the handlers they define for api.c's route table.
 * Only the api module's files include it. */
#ifndef DDPD_API_IMPL_H
#define DDPD_API_IMPL_H

#include "../schema/err.h"

struct http_request;
struct store_job;

/* Reads the job named by the route's {id} into *j (store_job_get: the caller clears it,
 * also after an error). DDPD_ENOTFOUND when there is none. */
ddpd_err api__job_get(struct http_request *req, struct store_job *j, struct ddpd_error *err);

/* GET /v1/jobs/{id}/pytorch (api_pytorch.c). */
ddpd_err api__h_pytorch(struct http_request *req, struct ddpd_error *err);

#endif
