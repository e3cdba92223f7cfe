#include "rtb_loop.h"

#include <netinet/in.h>
#include <sys/resource.h>
#include <time.h>

uint64_t rtb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t rtb_cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_utime.tv_sec * 1000000 + (uint64_t)ru.ru_utime.tv_usec +
           (uint64_t)ru.ru_stime.tv_sec * 1000000 + (uint64_t)ru.ru_stime.tv_usec;
}

void rtb_range(uint32_t total, uint32_t procs, uint32_t p, uint32_t *lo, uint32_t *hi)
{
    *lo = (uint32_t)((uint64_t)total * p / procs);
    *hi = (uint32_t)((uint64_t)total * (p + 1) / procs);
}

int rtb_go_open(uv_loop_t *loop, uv_pipe_t *go, int fd, void *data)
{
    if (fd < 0 || uv_pipe_init(loop, go, 0))
        return -1;
    go->data = data;
    if (uv_pipe_open(go, fd)) {
        uv_close((uv_handle_t *)go, NULL);
        return -1;
    }
    return fd;
}

/* The go pipe's bytes mean nothing. */
static void go_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    static char byte[16];
    *buf = uv_buf_init(byte, sizeof(byte));
}

int rtb_go_wait(uv_pipe_t *go, int go_fd, uv_read_cb cb, rtb_emit_fn emit, void *ctx,
                const rtb_report_t *rep)
{
    if (go_fd < 0)
        return 1;
    emit(ctx, RTB_EMIT_READY, rep);
    return uv_read_start((uv_stream_t *)go, go_alloc, cb) != 0;
}

int rtb_tcp_source(uv_tcp_t *tcp, const struct sockaddr *src)
{
    uv_os_fd_t fd;
    int one = 1;
    if (!uv_fileno((uv_handle_t *)tcp, &fd))
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    return uv_tcp_bind(tcp, src, 0);
}

int rtb_write(uv_stream_t *s, uv_write_t *req, rtb_buf_t *src, rtb_buf_t *busy, uv_write_cb cb)
{
    uv_buf_t b = uv_buf_init((char *)src->p, (unsigned)src->len);
    int n = uv_try_write(s, &b, 1);
    if (n < 0 && n != UV_EAGAIN)
        return n;
    size_t done = n > 0 ? (size_t)n : 0;
    if (done == src->len) {
        src->len = 0;
        return 0;
    }
    rtb_buf_t t = *busy;
    *busy = *src;
    *src = t;
    src->len = 0;
    b = uv_buf_init((char *)busy->p + done, (unsigned)(busy->len - done));
    int r = uv_write(req, s, &b, 1, cb);
    return r < 0 ? r : 1;
}
