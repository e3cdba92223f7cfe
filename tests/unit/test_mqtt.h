/*
** Raw MQTT over loopback for tests that start a broker in the process: a free
** port to listen on, and reading whole packets from a client socket with a
** deadline (tests never wait on a socket for ever).
*/
#ifndef RT_TEST_MQTT_H
#define RT_TEST_MQTT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#define TEST_MQTT_TIMEOUT_MS 3000

/* Reads exactly n bytes; false on EOF, error or a wait past timeout_ms. */
static inline bool read_full(int fd, uint8_t *buf, size_t n, int timeout_ms)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) <= 0)
            return false;
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

/* Reads one packet: returns its first byte (-1 on EOF, timeout or a body over cap). */
static inline int read_packet(int fd, uint8_t *body, size_t cap, size_t *len)
{
    uint8_t h, b;
    if (!read_full(fd, &h, 1, TEST_MQTT_TIMEOUT_MS))
        return -1;
    size_t rl = 0, mul = 1;
    do {
        if (!read_full(fd, &b, 1, TEST_MQTT_TIMEOUT_MS))
            return -1;
        rl += (b & 127) * mul;
        mul *= 128;
    } while (b & 128);
    if (rl > cap || !read_full(fd, body, rl, TEST_MQTT_TIMEOUT_MS))
        return -1;
    *len = rl;
    return h;
}

/* A TCP connection to 127.0.0.1:port; -1 if refused. */
static inline int tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A loopback port nobody listens on right now (bound and released). */
static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    return ntohs(a.sin_port);
}

#endif
