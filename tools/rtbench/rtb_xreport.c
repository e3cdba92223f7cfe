/*
 * rtb_xreport: what the XMPP commands print (rtb_xmpp.h): the per-second line and the
 * summary, from the merged report of every process.
 */
#include "rtb_xmpp.h"

#include <stdio.h>

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

void rtb_xmpp_tick_line(uint64_t second, const rtb_report_t *now, const rtb_report_t *prev,
                        const rtb_hist_t *e2e_second)
{
    const rtb_stats_t *s = &now->s, *p = &prev->s;
    fprintf(stderr,
            "rtbench[%3llus] logins=%llu logins/s=%llu failed=%llu lost=%llu sent/s=%llu "
            "recv/s=%llu chat p50=%.3fms p99=%.3fms max=%.3fms\n",
            (unsigned long long)second, (unsigned long long)s->conn_ok,
            (unsigned long long)(s->conn_ok - p->conn_ok), (unsigned long long)s->conn_fail,
            (unsigned long long)s->conn_lost, (unsigned long long)(s->sent - p->sent),
            (unsigned long long)(s->received - p->received), ms(rtb_hist_quantile(e2e_second, 0.5)),
            ms(rtb_hist_quantile(e2e_second, 0.99)), ms(e2e_second->max));
}

static void hist_json(const char *name, const rtb_hist_t *h)
{
    printf("\"%s\":{\"count\":%llu,\"p50_ms\":%.4f,\"p99_ms\":%.4f,\"p999_ms\":%.4f,"
           "\"max_ms\":%.4f},",
           name, (unsigned long long)h->count, ms(rtb_hist_quantile(h, 0.5)),
           ms(rtb_hist_quantile(h, 0.99)), ms(rtb_hist_quantile(h, 0.999)), ms(h->max));
}

static void hist_text(const char *name, const rtb_hist_t *h)
{
    printf("%-9s n=%llu p50=%.3fms p99=%.3fms p99.9=%.3fms max=%.3fms\n", name,
           (unsigned long long)h->count, ms(rtb_hist_quantile(h, 0.5)),
           ms(rtb_hist_quantile(h, 0.99)), ms(rtb_hist_quantile(h, 0.999)), ms(h->max));
}

void rtb_xmpp_summary(const rtb_opts_t *o, const rtb_report_t *m, uint64_t cpu_us,
                      uint64_t worst_p99_ns, uint64_t worst_max_ns)
{
    const rtb_stats_t *s = &m->s;
    double storm_s =
        s->t_conn_last > s->t_conn_first ? (double)(s->t_conn_last - s->t_conn_first) / 1e9 : 0;
    double run_s =
        s->t_run_end > s->t_run_start ? (double)(s->t_run_end - s->t_run_start) / 1e9 : 0;
    double rate = storm_s > 0 ? (double)s->hs_full / storm_s : 0;
    uint64_t missing = s->sent > s->unique ? s->sent - s->unique : 0;
    double both = s->conn_ok ? (double)s->roster_both / (double)s->conn_ok : 0;
    double cpu_s = (double)cpu_us / 1e6;
    if (o->json) {
        printf("{\"command\":\"%s\",\"procs\":%u,\"logins\":%llu,\"failed\":%llu,\"lost\":%llu,"
               "\"run_logins\":%llu,\"login_seconds\":%.6f,\"logins_per_s\":%.1f,",
               o->cmd_name, o->procs, (unsigned long long)s->conn_ok,
               (unsigned long long)s->conn_fail, (unsigned long long)s->conn_lost,
               (unsigned long long)s->hs_full, storm_s, rate);
        hist_json("login", &m->conn);
        printf("\"pairs\":%u,\"sent\":%llu,\"received\":%llu,\"missing\":%llu,\"gaps\":%llu,"
               "\"duplicates\":%llu,\"foreign\":%llu,\"protocol_errors\":%llu,",
               o->cmd == RTB_CMD_XCHAT ? o->pairs : 0, (unsigned long long)s->sent,
               (unsigned long long)s->received, (unsigned long long)missing,
               (unsigned long long)s->gaps, (unsigned long long)s->dups,
               (unsigned long long)s->foreign, (unsigned long long)s->proto_err);
        hist_json("chat", &m->e2e);
        printf("\"worst_second_p99_ms\":%.4f,\"worst_second_max_ms\":%.4f,"
               "\"roster_both_per_login\":%.2f,\"pbkdf2\":%llu,\"run_seconds\":%.3f,"
               "\"cpu_seconds\":%.3f}\n",
               ms(worst_p99_ns), ms(worst_max_ns), both, (unsigned long long)s->pbkdf2, run_s,
               cpu_s);
        return;
    }
    printf("rtbench %s: procs=%u\n", o->cmd_name, o->procs);
    printf("logins    done=%llu failed=%llu lost=%llu; in the run %llu over %.3fs: %.1f/s\n",
           (unsigned long long)s->conn_ok, (unsigned long long)s->conn_fail,
           (unsigned long long)s->conn_lost, (unsigned long long)s->hs_full, storm_s, rate);
    hist_text("login", &m->conn);
    if (o->cmd == RTB_CMD_XCHAT) {
        printf("chat      pairs=%u sent=%llu received=%llu missing=%llu gaps=%llu "
               "duplicates=%llu over %.3fs\n",
               o->pairs, (unsigned long long)s->sent, (unsigned long long)s->received,
               (unsigned long long)missing, (unsigned long long)s->gaps,
               (unsigned long long)s->dups, run_s);
        hist_text("chat", &m->e2e);
        printf("worst second: p99=%.3fms max=%.3fms\n", ms(worst_p99_ns), ms(worst_max_ns));
    }
    printf("rosters   %.2f items with subscription both per login; client PBKDF2 runs %llu\n", both,
           (unsigned long long)s->pbkdf2);
    printf("cpu       %.3fs user+sys (all processes)\n", cpu_s);
}
