/* client.h — `ddpd` as a client of a running `ddpd serve` (libcurl): submit, jobs, show,
 * watch, logs, cancel, rm, checkpoints, pull, generate, predict. The server's address comes
 * from --server or DDPD_SERVER, the token from --token-file or DDPD_TOKEN. Knows the REST
 * API of CONTRACT.md §7 and nothing of the server's insides.
 *
 * Exit codes: 0 done (a followed job succeeded); 1 the server is unreachable, answered
 * with an error, or a followed job failed; 2 a usage error, or a spec or request the server
 * rejected as invalid (400, 413, 422 on submit, generate, predict); 5 a followed job was
 * cancelled; 130 a generation ended by Ctrl-C. */
#ifndef DDPD_CLIENT_H
#define DDPD_CLIENT_H

#include <stdbool.h>
#include <stdio.h>

/* True when `name` is one of the client's commands. */
bool client_is_command(const char *name);

/* Runs the command argv[0] with its options argv[1..argc-1]. Returns the exit status. */
int client_main(int argc, char **argv);

/* One line per command for `ddpd --help`. */
void client_usage_lines(FILE *f);

#endif
