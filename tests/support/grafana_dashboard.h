// Grafana dashboards (JSON, as dashboard/ ships them) read the way Grafana runs them: every
// PromQL expression of every panel, with the dashboard's template variables filled in, asked
// of a real Prometheus.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tests/support/prometheus_server.h"

namespace gradhub::testing {

struct PanelQuery {
  std::string panel;  // the panel's title
  std::string ref_id;
  std::string expr;  // as written in the dashboard, variables unfilled
};

// Every target expression of every panel, panels inside collapsed rows included. Throws
// std::runtime_error when the file is not a dashboard.
std::vector<PanelQuery> DashboardQueries(const std::string& path);

// The names of the dashboard's template variables (templating.list[].name).
std::vector<std::string> DashboardVariables(const std::string& path);

// `expr` with $name and ${name} replaced by values[name]; unknown names are left as written.
std::string FillVariables(const std::string& expr,
                          const std::map<std::string, std::string>& values);

// Asks `prometheus` every query, variables filled; returns one line per query that failed or
// returned no finite sample ("panel [ref]: expr -> why"); empty when every panel has data.
std::vector<std::string> PanelsWithoutData(const PrometheusServer& prometheus,
                                           const std::vector<PanelQuery>& queries,
                                           const std::map<std::string, std::string>& values);

}  // namespace gradhub::testing
