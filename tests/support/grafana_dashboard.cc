#include "tests/support/grafana_dashboard.h"

#include <cctype>
#include <fstream>
#include <stdexcept>

namespace gradhub::testing {
namespace {

nlohmann::json ReadDashboard(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json dashboard = nlohmann::json::parse(in, nullptr, false);
  if (dashboard.is_discarded() || !dashboard.contains("panels")) {
    throw std::runtime_error(path + " is not a Grafana dashboard (JSON with \"panels\")");
  }
  return dashboard;
}

void CollectQueries(const nlohmann::json& panels, std::vector<PanelQuery>* queries) {
  for (const auto& panel : panels) {
    // A collapsed row carries its panels inside it.
    if (panel.contains("panels")) CollectQueries(panel["panels"], queries);
    if (!panel.contains("targets")) continue;
    for (const auto& target : panel["targets"]) {
      if (!target.contains("expr") || target["expr"].get<std::string>().empty()) continue;
      queries->push_back({panel.value("title", "(untitled)"), target.value("refId", ""),
                          target["expr"].get<std::string>()});
    }
  }
}

}  // namespace

std::vector<PanelQuery> DashboardQueries(const std::string& path) {
  std::vector<PanelQuery> queries;
  CollectQueries(ReadDashboard(path)["panels"], &queries);
  return queries;
}

std::vector<std::string> DashboardVariables(const std::string& path) {
  std::vector<std::string> names;
  const nlohmann::json dashboard = ReadDashboard(path);
  if (!dashboard.contains("templating")) return names;
  for (const auto& variable : dashboard["templating"].value("list", nlohmann::json::array())) {
    names.push_back(variable.value("name", ""));
  }
  return names;
}

std::string FillVariables(const std::string& expr,
                          const std::map<std::string, std::string>& values) {
  std::string filled;
  for (size_t i = 0; i < expr.size();) {
    if (expr[i] != '$') {
      filled += expr[i++];
      continue;
    }
    const bool braced = i + 1 < expr.size() && expr[i + 1] == '{';
    size_t start = i + (braced ? 2 : 1), end = start;
    while (end < expr.size() &&
           (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_')) {
      ++end;
    }
    const auto value = values.find(expr.substr(start, end - start));
    if (value == values.end() || (braced && (end >= expr.size() || expr[end] != '}'))) {
      filled += expr[i++];
      continue;
    }
    filled += value->second;
    i = end + (braced ? 1 : 0);
  }
  return filled;
}

std::vector<std::string> PanelsWithoutData(const PrometheusServer& prometheus,
                                           const std::vector<PanelQuery>& queries,
                                           const std::map<std::string, std::string>& values) {
  std::vector<std::string> failures;
  for (const PanelQuery& query : queries) {
    const std::string expr = FillVariables(query.expr, values);
    const PromResult result = prometheus.Query(expr);
    std::string why = result.error;
    if (why.empty() && result.samples == 0) why = "empty result";
    if (why.empty() && result.finite_samples == 0) why = "only NaN or infinite values";
    if (!why.empty())
      failures.push_back(query.panel + " [" + query.ref_id + "]: " + expr + " -> " + why);
  }
  return failures;
}

}  // namespace gradhub::testing
