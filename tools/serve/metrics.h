// A small Prometheus registry for `mzcache serve`'s GET /metrics: counters, gauges and histograms,
// each a family (name, help, type) of samples told apart by their labels, rendered in the
// Prometheus text exposition format 0.0.4 (# HELP, # TYPE, then the samples; histograms as
// name_bucket{le="..."} cumulative, name_sum, name_count).
//
// Thread-safety: every method may be called from any thread (one mutex).
// Names: a family's name must match [a-zA-Z_:][a-zA-Z0-9_:]* and a label's [a-zA-Z_][a-zA-Z0-9_]*
// (not "le"); a bad name, or a name used again with another type or other buckets, is a
// programming error: the call is ignored (nothing rendered for it), never a crash. Label values
// and help texts may hold any bytes: they are escaped as the format says (\\, \", \n in values;
// \\ and \n in help).
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mz::serve {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // Counter: adds v (>= 0; a negative v is ignored) to name{labels}, created at 0 on first use.
  void Add(const std::string& name, const std::string& help, double v, const MetricLabels& labels = {});
  // Sets name{labels} to v: a gauge, or (type kCounter) a counter kept elsewhere (a library's own
  // cumulative figure copied at scrape time).
  void Set(const std::string& name, const std::string& help, double v, const MetricLabels& labels = {},
           Type type = Type::kGauge);
  // Histogram: one observation of v. buckets: the upper bounds, increasing (+Inf is implied);
  // fixed by the family's first call.
  void Observe(const std::string& name, const std::string& help, const std::vector<double>& buckets, double v,
               const MetricLabels& labels = {});
  // Declares a family without samples (rendered with # HELP and # TYPE only; a histogram without
  // labels is rendered with zero counts, so scrapers see it before the first observation).
  void Declare(const std::string& name, const std::string& help, Type type, const std::vector<double>& buckets = {});

  // The text exposition: families in name order, samples in label order. Content-Type:
  // kContentType.
  std::string Render() const;
  static constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

  // The value of a counter or gauge sample (0 if absent): for tests.
  double Value(const std::string& name, const MetricLabels& labels = {}) const;

  static bool ValidName(const std::string& name);
  static bool ValidLabelName(const std::string& name);
  static std::string EscapeLabelValue(const std::string& v);
  static std::string EscapeHelp(const std::string& v);
  // A sample value as the format writes it: +Inf, -Inf, NaN, or the shortest exact decimal.
  static std::string FormatValue(double v);

 private:
  struct Sample {
    double value = 0;                // counter / gauge
    std::vector<uint64_t> counts;    // histogram: per bucket (not cumulative), +Inf last
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    std::string help;
    Type type = Type::kGauge;
    std::vector<double> buckets;
    std::map<MetricLabels, Sample> samples;
  };
  // REQUIRES mu_. The family, created if new; nullptr if the call is invalid (see above).
  Family* Get(const std::string& name, const std::string& help, Type type, const std::vector<double>* buckets,
              const MetricLabels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

}  // namespace mz::serve
