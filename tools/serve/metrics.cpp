#include "tools/serve/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace mz::serve {

bool MetricsRegistry::ValidName(const std::string& n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(n[i]);
    const bool ok = std::isalpha(c) || c == '_' || c == ':' || (i > 0 && std::isdigit(c));
    if (!ok || c > 127) return false;
  }
  return true;
}

bool MetricsRegistry::ValidLabelName(const std::string& n) {
  if (n.empty() || n == "le" || n.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(n[i]);
    if (c > 127 || !(std::isalpha(c) || c == '_' || (i > 0 && std::isdigit(c)))) return false;
  }
  return true;
}

std::string MetricsRegistry::EscapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string MetricsRegistry::EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string MetricsRegistry::FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  char buf[40];
  for (int prec = 6; prec <= 17; ++prec) {  // the shortest that reads back exactly
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

MetricsRegistry::Family* MetricsRegistry::Get(const std::string& name, const std::string& help, Type type,
                                              const std::vector<double>* buckets, const MetricLabels& labels) {
  if (!ValidName(name)) return nullptr;
  for (const auto& [k, v] : labels)
    if (!ValidLabelName(k)) return nullptr;
  auto it = families_.find(name);
  if (it == families_.end()) {
    if (buckets) {
      for (size_t i = 0; i < buckets->size(); ++i)
        if (!std::isfinite((*buckets)[i]) || (i > 0 && (*buckets)[i] <= (*buckets)[i - 1])) return nullptr;
    }
    Family f;
    f.help = help;
    f.type = type;
    if (buckets) f.buckets = *buckets;
    it = families_.emplace(name, std::move(f)).first;
  } else if (it->second.type != type || (buckets && *buckets != it->second.buckets)) {
    return nullptr;
  } else if (it->second.help.empty()) {
    it->second.help = help;
  }
  return &it->second;
}

void MetricsRegistry::Add(const std::string& name, const std::string& help, double v, const MetricLabels& labels) {
  if (!(v >= 0)) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (Family* f = Get(name, help, Type::kCounter, nullptr, labels)) f->samples[labels].value += v;
}

void MetricsRegistry::Set(const std::string& name, const std::string& help, double v, const MetricLabels& labels,
                          Type type) {
  if (type == Type::kHistogram) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (Family* f = Get(name, help, type, nullptr, labels)) f->samples[labels].value = v;
}

void MetricsRegistry::Observe(const std::string& name, const std::string& help, const std::vector<double>& buckets,
                              double v, const MetricLabels& labels) {
  if (std::isnan(v)) return;
  std::lock_guard<std::mutex> lk(mu_);
  Family* f = Get(name, help, Type::kHistogram, &buckets, labels);
  if (!f) return;
  Sample& s = f->samples[labels];
  if (s.counts.empty()) s.counts.assign(f->buckets.size() + 1, 0);
  const size_t i = size_t(std::lower_bound(f->buckets.begin(), f->buckets.end(), v) - f->buckets.begin());
  s.counts[i]++;  // the first bucket whose bound is >= v (le: less or equal), or +Inf
  s.sum += v;
  s.count++;
}

void MetricsRegistry::Declare(const std::string& name, const std::string& help, Type type,
                              const std::vector<double>& buckets) {
  std::lock_guard<std::mutex> lk(mu_);
  Family* f = Get(name, help, type, type == Type::kHistogram ? &buckets : nullptr, {});
  if (f && type == Type::kHistogram && f->samples.empty()) f->samples[{}].counts.assign(f->buckets.size() + 1, 0);
}

double MetricsRegistry::Value(const std::string& name, const MetricLabels& labels) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second.samples.find(labels);
  if (s == it->second.samples.end()) return 0;
  return it->second.type == Type::kHistogram ? double(s->second.count) : s->second.value;
}

namespace {

std::string LabelText(const MetricLabels& labels, const std::string* le = nullptr) {
  if (labels.empty() && !le) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ",";
    first = false;
    out += k + "=\"" + MetricsRegistry::EscapeLabelValue(v) + "\"";
  }
  if (le) out += std::string(first ? "" : ",") + "le=\"" + *le + "\"";
  return out + "}";
}

}  // namespace

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    const char* type = f.type == Type::kCounter ? "counter" : f.type == Type::kGauge ? "gauge" : "histogram";
    // An empty help text is written as the name (parsers refuse "# HELP name" alone).
    out += "# HELP " + name + " " + EscapeHelp(f.help.empty() ? name : f.help) + "\n";
    out += "# TYPE " + name + " " + type + "\n";
    for (const auto& [labels, s] : f.samples) {
      if (f.type != Type::kHistogram) {
        out += name + LabelText(labels) + " " + FormatValue(s.value) + "\n";
        continue;
      }
      uint64_t cum = 0;
      for (size_t i = 0; i <= f.buckets.size(); ++i) {
        cum += i < s.counts.size() ? s.counts[i] : 0;
        const std::string le = i < f.buckets.size() ? FormatValue(f.buckets[i]) : "+Inf";
        out += name + "_bucket" + LabelText(labels, &le) + " " + std::to_string(cum) + "\n";
      }
      out += name + "_sum" + LabelText(labels) + " " + FormatValue(s.sum) + "\n";
      out += name + "_count" + LabelText(labels) + " " + std::to_string(s.count) + "\n";
    }
  }
  return out;
}

}  // namespace mz::serve
