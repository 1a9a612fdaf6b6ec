/* comm/comm_impl.h — what the files of the comm module share and nobody else sees. */
#ifndef DDPD_COMM_IMPL_H
#define DDPD_COMM_IMPL_H

#include "../comm.h"

/* Wraps the backend {*ops, *ctx} in the host-staging adaptor (comm/staged.c) for tensors
 * of `dev`, replacing both; the adaptor owns the wrapped ctx from then on. */
ddpd_err comm__staged_wrap(const struct comm_ops **ops, void **ctx, struct dev dev, char *errbuf,
                           size_t errcap);

#endif
