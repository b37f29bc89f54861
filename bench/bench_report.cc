#include "bench_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json.h"

namespace simba::bench {
namespace {

using internal::json_string;

std::string format_number(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// What the CDF charts are drawn from.
constexpr double kQuantiles[] = {0.0,  0.01, 0.05, 0.1,  0.25,  0.5,
                                 0.75, 0.9,  0.95, 0.99, 0.999, 1.0};

}  // namespace

Field Field::integer(std::string key, long long value) {
  return {std::move(key), std::to_string(value)};
}
Field Field::number(std::string key, double value) {
  return {std::move(key), format_number("%.3f", value)};
}
Field Field::text(std::string key, const std::string& value) {
  return {std::move(key), json_string(value)};
}
Field Field::boolean(std::string key, bool value) {
  return {std::move(key), value ? "true" : "false"};
}

double micros(BenchClock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

double percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto index = static_cast<std::size_t>(p * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(index, samples.size() - 1)];
}

double ops_per_second(const std::vector<double>& micros) {
  double total = 0;
  for (const double m : micros) total += m;
  return total > 0 ? static_cast<double>(micros.size()) * 1e6 / total : 0;
}

void fail(const std::string& what) {
  std::fprintf(stderr, "simba-bench: %s\n", what.c_str());
  std::exit(1);
}

void Report::add(const Row& row) {
  std::vector<double> sorted = row.micros;
  std::sort(sorted.begin(), sorted.end());
  const auto at = [&](double p) { return percentile(sorted, p); };
  const double p50 = at(0.5);
  const double row_floor = row.floor > 0 ? row.floor : floor_;
  const double ratio = row_floor > 0 && row.round_trips > 0 && !sorted.empty()
                           ? p50 / (row_floor * row.round_trips)
                           : 0;
  if (json_) {
    std::ostringstream out;
    out << "{\"store\":" << json_string(scheme_) << ",\"scenario\":" << json_string(row.scenario)
        << ",\"case\":" << json_string(row.name) << ",\"n\":" << sorted.size()
        << ",\"p50_us\":" << format_number("%.1f", p50)
        << ",\"p99_us\":" << format_number("%.1f", at(0.99))
        << ",\"p999_us\":" << format_number("%.1f", at(0.999))
        << ",\"max_us\":" << format_number("%.1f", at(1.0))
        << ",\"ops_per_s\":" << format_number("%.1f", row.ops_per_second)
        << ",\"floor_ratio\":" << format_number("%.3f", ratio)
        << ",\"round_trips\":" << row.round_trips << ",\"quantiles_us\":[";
    if (!sorted.empty()) {
      bool first = true;
      for (const double q : kQuantiles) {
        out << (first ? "" : ",") << "[" << q << "," << format_number("%.1f", at(q)) << "]";
        first = false;
      }
    }
    out << "]";
    for (const auto& field : row.fields) out << "," << json_string(field.key) << ":" << field.json;
    out << "}";
    std::printf("%s\n", out.str().c_str());
  } else {
    if (!header_printed_) {
      std::printf("%-12s %-48s %6s %10s %10s %10s %10s %7s  %s\n", "scenario", "case", "n",
                  "p50 us", "p99 us", "max us", "ops/s", "x floor", "notes");
      header_printed_ = true;
    }
    std::string notes;
    for (const auto& field : row.fields) notes += field.key + "=" + field.json + " ";
    std::printf("%-12s %-48s %6zu %10.1f %10.1f %10.1f %10.1f %7s  %s\n", row.scenario.c_str(),
                row.name.c_str(), sorted.size(), p50, at(0.99), at(1.0), row.ops_per_second,
                ratio > 0 ? format_number("%.2f", ratio).c_str() : "-", notes.c_str());
  }
  std::fflush(stdout);
}

int count_threads() {
  int count = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++count;
  }
  return count;
}

int count_simba_threads() {
  int count = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::ifstream comm(it->path() / "comm");
    std::string name;
    if (std::getline(comm, name) && name.rfind("simba:", 0) == 0) ++count;
  }
  return count;
}

int count_sockets() {
  int count = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_error;
    const auto target = std::filesystem::read_symlink(it->path(), link_error);
    if (!link_error && target.string().rfind("socket:", 0) == 0) ++count;
  }
  return count;
}

double resident_mi_b() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0;
}

}  // namespace simba::bench
