#include "tools/cli/sustained_cli.h"

#include <cstdio>

namespace mz::cli {

void AddSustainedOptions(CLI::App* c, SustainedArgs& a) {
  c->add_flag("--sustained", a.on,
              "sustained mode: cap threads and duty cycle, step threads down on heat (thermal zones) or on "
              "tokens/s drift, back up with hysteresis");
  c->add_option("--max-threads", a.max_threads, "sustained: thread cap (0 = --threads)")->check(CLI::Range(0, 256));
  c->add_option("--min-threads", a.min_threads, "sustained: never below this many threads")->check(CLI::Range(1, 256));
  c->add_option("--duty", a.duty, "sustained: compute time / wall time cap, (0, 1] (sleeps after each step)")
      ->check(CLI::Range(0.01, 1.0));
  c->add_option("--high-c", a.high_c,
                "sustained: step down at this temperature, C (0 = each zone's passive trip point - --trip-margin)")
      ->check(CLI::Range(0.0, 199.0));
  c->add_option("--trip-margin", a.margin_c, "sustained: degrees below a zone's trip point to step down at")
      ->check(CLI::Range(0.0, 99.0));
  c->add_option("--band", a.band_c, "sustained: hysteresis, step up only below high - band (C)")->check(CLI::Range(0.0, 100.0));
  c->add_option("--hold-up", a.hold_up_s, "sustained: seconds below the band before a step up")->check(CLI::Range(0.0, 86400.0));
  c->add_option("--min-interval", a.min_interval_s, "sustained: at most one thread change per this many seconds")
      ->check(CLI::Range(0.0, 86400.0));
  c->add_option("--drift", a.drift, "sustained: step down when tokens/s falls below (1 - drift) of the best recent (0 = off)")
      ->check(CLI::Range(0.0, 0.99));
  c->add_option("--probe-up", a.probe_up_s, "sustained, no sensor: retry one more thread this long after a drift step (0 = never)")
      ->check(CLI::Range(0.0, 86400.0));
  c->add_option("--thermal-root", a.thermal_root, "sustained: the thermal class directory (a fake tree for tests)");
  c->add_option("--thermal-zone", a.zone, "sustained: only zones whose type contains this (e.g. cpu)");
}

namespace {
// mz_sustained_params.on_event: the chat / run line of a thread change or a refusal.
void PrintSustainedEvent(const mz_sustained_event* ev, void*) {
  if (!ev->refused)
    std::fprintf(stderr, "\n[sustained: %d -> %d threads (%s: %s)]\n", ev->from, ev->to, ev->reason, ev->why);
  else
    std::fprintf(stderr, "\n[sustained: wanted %d threads (%s: %s), refused: %s: %s]\n", ev->wanted, ev->reason, ev->why,
                 mz_status_str(ev->status), ev->error);
}
}  // namespace

int StartSustained(const SustainedArgs& a, mz_context* ctx) {
  if (!a.on) return MZ_OK;
  mz_sustained_params p = mz_sustained_default_params();
  p.max_threads = a.max_threads;
  p.min_threads = a.min_threads;
  p.duty_cycle = float(a.duty);
  p.high_c = float(a.high_c);
  p.trip_margin_c = float(a.margin_c);
  p.band_c = float(a.band_c);
  p.hold_up_s = float(a.hold_up_s);
  p.min_interval_s = float(a.min_interval_s);
  p.drift = float(a.drift);
  p.probe_up_s = float(a.probe_up_s);
  p.thermal_root = a.thermal_root.c_str();  // read by mz_context_set_sustained only
  p.thermal_zone = a.zone.empty() ? nullptr : a.zone.c_str();
  p.on_event = PrintSustainedEvent;
  int rc = mz_context_set_sustained(ctx, &p);
  if (rc != MZ_OK) return rc;
  mz_sustained_info s;
  rc = mz_context_get_sustained_info(ctx, &s);
  if (rc != MZ_OK) return rc;
  std::fprintf(stderr, "[sustained: threads %d..%d (now %d), duty cycle %.2f; %s]\n", s.min_threads, s.max_threads,
               s.threads, a.duty, s.sensors);
  return MZ_OK;
}

}  // namespace mz::cli
