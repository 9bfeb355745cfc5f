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

Status StartSustained(const SustainedArgs& a, Context* ctx, std::unique_ptr<SustainedMode>* out) {
  out->reset();
  if (!a.on) return Status::Ok();
  SustainedModeOptions o;
  o.control.max_threads = a.max_threads;
  o.control.min_threads = a.min_threads;
  o.control.band_c = a.band_c;
  o.control.hold_up_ns = uint64_t(a.hold_up_s * 1e9);
  o.control.min_interval_ns = uint64_t(a.min_interval_s * 1e9);
  o.control.drift = a.drift;
  o.control.probe_up_ns = uint64_t(a.probe_up_s * 1e9);
  o.duty = a.duty;
  o.high_c = a.high_c;
  o.trip_margin_c = a.margin_c;
  o.thermal_root = a.thermal_root;
  o.zone_filter = a.zone;
  auto m = std::make_unique<SustainedMode>(Env::Default(), ctx, o);
  MZ_RETURN_IF_ERROR(m->Init());
  const SustainedStats s = m->stats();
  std::fprintf(stderr, "[sustained: threads %d..%d (now %d), duty cycle %.2f; %s]\n", s.min_threads, s.max_threads,
               s.threads, a.duty, s.sensors.c_str());
  *out = std::move(m);
  return Status::Ok();
}

void SustainedAfterStep(SustainedMode* m, int n, uint64_t t0, uint64_t t1) {
  if (!m) return;
  SustainedEvent ev;
  m->AfterStep(n, t0, t1, &ev);
  if (ev.changed)
    std::fprintf(stderr, "\n[sustained: %d -> %d threads (%s: %s)]\n", ev.from, ev.to, SustainedReasonName(ev.reason),
                 ev.why.c_str());
  else if (ev.refused)
    std::fprintf(stderr, "\n[sustained: wanted %s threads (%s), refused: %s]\n", ev.why.c_str(),
                 SustainedReasonName(ev.reason), ev.status.ToString().c_str());
}

}  // namespace mz::cli
