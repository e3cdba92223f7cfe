/*
 * rtb_loop: what the MQTT worker (rtb_worker.c) and the XMPP worker (rtb_xmpp.c) share
 * around their libuv loops: the clock, the process's CPU, the split of work over
 * --procs, the parent's go pipe, source addresses and the write path.
 */
#ifndef RTB_LOOP_H
#define RTB_LOOP_H

#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "rtb_mqtt.h"
#include "rtbench.h"

#define RTB_GO_WAIT_MAX_S 300.0 /* longest wait for the parent's go, seconds */

/* CLOCK_MONOTONIC in ns: one clock for every process of the machine. */
uint64_t rtb_now_ns(void);

/* user+sys CPU of this process, in us. */
uint64_t rtb_cpu_us(void);

/* Process p's share [lo, hi) of total units split over procs processes. */
void rtb_range(uint32_t total, uint32_t procs, uint32_t p, uint32_t *lo, uint32_t *hi);

/*
 * Opens the read end of the parent's go pipe on go (go->data = data) and returns fd, or
 * -1 when fd is -1 or cannot be opened: then there is no barrier.
 */
int rtb_go_open(uv_loop_t *loop, uv_pipe_t *go, int fd, void *data);

/*
 * The barrier before a run: with a go pipe (go_fd >= 0), reports rep as ready and has cb
 * called on the parent's go (any byte, EOF or error); returns 0 then. Returns 1 when the
 * run should start now: no pipe, or it cannot be read.
 */
int rtb_go_wait(uv_pipe_t *go, int go_fd, uv_read_cb cb, rtb_emit_fn emit, void *ctx,
                const rtb_report_t *rep);

/*
 * Binds tcp to the source address src, leaving the port to connect(), which picks it
 * for the whole 4-tuple: a port picked at bind time must be unique per address, which
 * caps a source address near 28K connections and makes every bind search the range.
 */
int rtb_tcp_source(uv_tcp_t *tcp, const struct sockaddr *src);

/*
 * Writes src: a plain write first (uv_write re-arms the epoll watcher on every call, an
 * extra syscall per flush, while uv_try_write is the bare write), and only what the
 * socket does not take right away through uv_write(req, cb) from busy, which trades
 * places with src. src is empty on return. Returns 0 when all was written, 1 when a
 * uv_write is in flight (busy is its until cb), or a negative libuv error.
 */
int rtb_write(uv_stream_t *s, uv_write_t *req, rtb_buf_t *src, rtb_buf_t *busy, uv_write_cb cb);

#endif
