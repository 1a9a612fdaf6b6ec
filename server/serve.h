/* serve.h — `ddpd serve`: the job server. Wires the store, the hub, the supervisor and
 * the HTTP layer together, and shuts them down in order on SIGTERM/SIGINT. */
#ifndef DDPD_SERVE_H
#define DDPD_SERVE_H

/* argv[0] is "serve", its options follow. Returns the exit status. */
int serve_main(int argc, char **argv, const char *self_dir);

#endif
