/* opt.h — what the `ddpd` commands (serve, run and the client's) say when getopt_long
 * (with opterr = 0 and optstring starting with ':') refuses an option: unknown, ambiguous
 * or missing its value, naming the option as the user wrote it. Knows nothing else. */
#ifndef DDPD_OPT_H
#define DDPD_OPT_H

#include <getopt.h>

/* Prints "ddpd CMD: ..." on stderr for getopt_long's answer c ('?' or ':') right after
 * it returned, with the argv and the long options it was given. */
void opt_complain(const char *cmd, int c, char **argv, const struct option *longs);

#endif
