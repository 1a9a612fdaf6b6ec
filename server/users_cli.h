/* users_cli.h — `ddpd users add|list|remove|rotate|set` on the database directly
 * (users_cli.c). */
#ifndef DDPD_USERS_CLI_H
#define DDPD_USERS_CLI_H

/* argv[0] is "users". The exit status: 0, 1 (the database failed), 2 (a usage error, an
 * unknown user, a name taken). */
int users_main(int argc, char **argv);

#endif
