/* http_addr.c — the addresses of the HTTP layer: what `--listen` takes, which Host and
 * Origin headers name this server, and the listening socket. Knows no requests. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http_impl.h"

/* ---- addresses ------------------------------------------------------------------------ */

/* An IPv4 address in any numeric form inet_aton takes ("127.0.0.1", "127.1", "0x7f.1"),
 * nothing else around it (inet_aton itself stops at white space and ignores the rest). */
static bool ipv4_parse(const char *h, struct in_addr *a)
{
    return h[0] && strspn(h, "0123456789abcdefABCDEFxX.") == strlen(h) && inet_aton(h, a) != 0;
}

/* "ADDR:PORT" / "[ADDR6]:PORT" -> sockaddr. ADDR is numeric (IPv4 in any form inet_aton
 * takes, "127.1" included) or "localhost" (127.0.0.1: the loopback name every host has,
 * resolved without a resolver). False with the reason in why[cap] (may be NULL). */
static bool addr_parse_why(const char *addr, struct sockaddr_storage *ss, socklen_t *len, char *why,
                           size_t cap)
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *port;
    char scratch[8];
    if (!why) {
        why = scratch;
        cap = sizeof scratch;
    }
    memset(ss, 0, sizeof *ss);
    if (!addr || !*addr) {
        snprintf(why, cap, "no address (give ADDR:PORT, e.g. 127.0.0.1:8080)");
        return false;
    }
    bool v6 = addr[0] == '[';
    if (v6) {
        const char *end = strchr(addr, ']');
        if (!end || end[1] != ':' || (size_t)(end - addr - 1) >= sizeof host) {
            snprintf(why, cap, "an IPv6 address is written [ADDR]:PORT, e.g. [::1]:8080");
            return false;
        }
        memcpy(host, addr + 1, (size_t)(end - addr - 1));
        host[end - addr - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon || (size_t)(colon - addr) >= sizeof host) {
            snprintf(why, cap, "no port (give ADDR:PORT, e.g. 127.0.0.1:8080; port 0 = any free port)");
            return false;
        }
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        port = colon + 1;
    }
    if (!*port || strlen(port) > 5 || strspn(port, "0123456789") != strlen(port) ||
        strtol(port, NULL, 10) > 65535) {
        snprintf(why, cap, "port \"%.16s\" is not a number from 0 to 65535", port);
        return false;
    }
    long p = strtol(port, NULL, 10);
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) {
            snprintf(why, cap, "\"%s\" is not an IPv6 address", host);
            return false;
        }
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)p);
        *len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        if (!strcasecmp(host, "localhost"))
            a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        else if (!ipv4_parse(host, &a->sin_addr)) {
            snprintf(why, cap, "\"%s\" is not an IPv4 address or localhost (host names are not looked up)",
                     host);
            return false;
        }
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)p);
        *len = sizeof *a;
    }
    return true;
}

static bool addr_parse(const char *addr, struct sockaddr_storage *ss, socklen_t *len)
{
    return addr_parse_why(addr, ss, len, NULL, 0);
}

bool http_addr_check(const char *addr, char *why, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len;
    return addr_parse_why(addr, &ss, &len, why, cap);
}

bool http_addr_is_loopback(const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (!addr_parse(addr, &ss, &len))
        return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
    if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
        return true;
    return IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
}

/* A numeric port after a host: "" or ":1".. ":65535" (digits only). */
static bool port_ok(const char *p)
{
    if (!*p)
        return true;
    if (*p != ':' || !p[1] || strlen(p + 1) > 5 || strspn(p + 1, "0123456789") != strlen(p + 1))
        return false;
    return strtol(p + 1, NULL, 10) <= 65535;
}

bool http_host_is_local(const char *host, bool any_ip)
{
    char h[INET6_ADDRSTRLEN + 1];
    const char *rest;
    if (!host)
        return false;
    if (host[0] == '[') {
        const char *end = strchr(host, ']');
        if (!end || (size_t)(end - host - 1) >= sizeof h)
            return false;
        memcpy(h, host + 1, (size_t)(end - host - 1));
        h[end - host - 1] = '\0';
        rest = end + 1;
        struct in6_addr a6;
        if (!port_ok(rest) || inet_pton(AF_INET6, h, &a6) != 1)
            return false;
        return any_ip || IN6_IS_ADDR_LOOPBACK(&a6);
    }
    size_t n = strcspn(host, ":");
    if (n == 0 || n >= sizeof h)
        return false;
    memcpy(h, host, n);
    h[n] = '\0';
    rest = host + n;
    if (!port_ok(rest))
        return false;
    if (!strcasecmp(h, "localhost"))
        return true;
    /* Dotted quad only: inet_pton refuses the short forms ("127.1") and octal. */
    struct in_addr a4;
    if (inet_pton(AF_INET, h, &a4) != 1)
        return false;
    return any_ip || (ntohl(a4.s_addr) >> 24) == 127;
}

bool http_origin_is_host(const char *origin, const char *host)
{
    if (!origin || !host || !*host)
        return false;
    const char *o = NULL;
    if (!strncasecmp(origin, "http://", 7))
        o = origin + 7;
    else if (!strncasecmp(origin, "https://", 8))
        o = origin + 8;
    return o && !strcasecmp(o, host);
}

/* ---- the listening socket ------------------------------------------------------------------ */

int http__listen_on(const char *addr, struct ddpd_error *err)
{
    struct sockaddr_storage ss;
    socklen_t len;
    char why[160];
    if (!addr_parse_why(addr, &ss, &len, why, sizeof why)) {
        ddpd_error_set(err, DDPD_EINTERNAL, "listen", "bad listen address '%s': %s", addr ? addr : "", why);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 511) != 0) {
        ddpd_error_set(err, DDPD_EIO, "listen", "cannot listen on %s: %s", addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

int http_listen(const char *addr, struct ddpd_error *err)
{
    int fd = http__listen_on(addr, err);
    if (fd >= 0 && fd <= 2) { /* 0..2 mean "none" in http_config.listen_fd */
        int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (high < 0)
            ddpd_error_set(err, DDPD_EIO, "listen", "cannot listen on %s: %s", addr, strerror(errno));
        close(fd);
        fd = high;
    }
    return fd;
}
