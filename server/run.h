/* run.h — `ddpd run`: one job on this host without a server, like torchrun. Parses the
 * spec, starts the ranks through the launcher, prints their events, and exits with the
 * first failing rank's code. */
#ifndef DDPD_RUN_H
#define DDPD_RUN_H

/* argv[0] is "run", its options follow. Returns the exit status. */
int run_main(int argc, char **argv, const char *self_dir);

#endif
