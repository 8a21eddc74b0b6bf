#pragma once

#include <stdexcept>
#include <string>

namespace gradhub {

// The job's own input is wrong: a spec field, a data file, a model file. Never retried (the
// trainer exits with its user-error code); the message names the field or the path and line.
// `field` is the spec path in proto JSON spelling, e.g. "model.mlp.layers", or "" for data.
class UserError : public std::runtime_error {
 public:
  UserError(std::string field, const std::string& message)
      : std::runtime_error(field.empty() ? message : field + ": " + message),
        field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

}  // namespace gradhub
