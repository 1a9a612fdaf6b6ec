/* check.h — the three strengths of a check (SQLite's, STYLE.md "Errors and ownership").
 * Header only; knows nothing of ddpd's errors. What input can cause is never checked here:
 * it is an error value (schema/err.h), reported with the field, file or rank it names.
 *
 *   ASSERT(x)  an invariant no input can break. On in every build: when x is false it
 *              prints "file:line: assertion failed: x" to stderr and aborts.
 *   ALWAYS(x)  "x cannot be false, but if it were, survive": evaluates to x, so the caller
 *              keeps a handled path (`if (ALWAYS(p)) use(p);`).
 *   NEVER(x)   the same for a condition that cannot be true (`if (NEVER(n < 0)) return -1;`).
 *
 * ALWAYS and NEVER abort like ASSERT in debug builds (DDPD_DEBUG: CMake's Debug type,
 * sanitizer and fuzz builds), so that tests find the impossible; in release builds they are
 * just x, and the handled path keeps the server up. x is evaluated exactly once in every
 * build, so it may have side effects (SQLite's rule: better that it has none). */
#ifndef DDPD_BASE_CHECK_H
#define DDPD_BASE_CHECK_H

#include <stdbool.h>

/* Prints "file:line: assertion failed: expr" to stderr and aborts. */
_Noreturn void base_check_fail(const char *file, int line, const char *expr);

#define ASSERT(x) ((x) ? (void)0 : base_check_fail(__FILE__, __LINE__, #x))

#ifdef DDPD_DEBUG
#define ALWAYS(x) ((x) ? true : (base_check_fail(__FILE__, __LINE__, "ALWAYS(" #x ")"), false))
#define NEVER(x)  ((x) ? (base_check_fail(__FILE__, __LINE__, "NEVER(" #x ")"), true) : false)
#else
#define ALWAYS(x) ((x) ? true : false)
#define NEVER(x)  ((x) ? true : false)
#endif

#endif
