#include "services/common/tls/cluster_ca.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/common/status_macros.h"

namespace gradhub::tls {
namespace {

namespace fs = std::filesystem;

struct FreeKey {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct FreeCert {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct FreeBio {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct FreeNames {
  void operator()(GENERAL_NAMES* names) const { GENERAL_NAMES_free(names); }
};
using Key = std::unique_ptr<EVP_PKEY, FreeKey>;
using Cert = std::unique_ptr<X509, FreeCert>;
using Bio = std::unique_ptr<BIO, FreeBio>;
using Names = std::unique_ptr<GENERAL_NAMES, FreeNames>;

constexpr char kCaName[] = "gradhub cluster CA";
constexpr char kServerName[] = "gradhub server";
// Backdated, so that a machine whose clock is a little behind accepts a fresh certificate.
constexpr absl::Duration kBackdate = absl::Hours(1);

// A subjectAltName entry: a DNS name or an IP address.
struct AltName {
  bool ip = false;
  std::string value;          // as given
  std::string address_bytes;  // the address, 4 or 16 bytes, when ip
};

absl::Status OpenSslError(const std::string& what) {
  return absl::InternalError(absl::StrCat("tls: ", what, " failed (OpenSSL)"));
}

// ---------------------------------------------------------------------------------------------
// Names.

absl::StatusOr<AltName> ParseHost(const std::string& host) {
  unsigned char address[16];
  if (inet_pton(AF_INET, host.c_str(), address) == 1) {
    return AltName{true, host, std::string(reinterpret_cast<char*>(address), 4)};
  }
  if (inet_pton(AF_INET6, host.c_str(), address) == 1) {
    return AltName{true, host, std::string(reinterpret_cast<char*>(address), 16)};
  }
  static const std::regex kDnsName(
      "[a-zA-Z0-9_]([a-zA-Z0-9_-]{0,62})(\\.[a-zA-Z0-9_]([a-zA-Z0-9_-]{0,62}))*");
  if (host.size() > 253 || !std::regex_match(host, kDnsName)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--hosts: '", host,
                     "' is neither a DNS name (labels of letters, digits, '-', '_' "
                     "joined by '.') nor an IP address"));
  }
  return AltName{false, host, ""};
}

absl::Status CheckNodeName(const std::string& node) {
  static const std::regex kNode("[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}");
  if (std::regex_match(node, kNode)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--nodes: '", node, "' is not a node name ([a-zA-Z0-9][a-zA-Z0-9._-]{0,62})"));
}

absl::StatusOr<Names> ToGeneralNames(const std::vector<AltName>& alt_names) {
  Names names(GENERAL_NAMES_new());
  if (names == nullptr) return OpenSslError("GENERAL_NAMES_new");
  for (const AltName& alt : alt_names) {
    GENERAL_NAME* name = GENERAL_NAME_new();
    ASN1_STRING* value = alt.ip ? ASN1_OCTET_STRING_new() : ASN1_IA5STRING_new();
    const std::string& bytes = alt.ip ? alt.address_bytes : alt.value;
    if (name == nullptr || value == nullptr ||
        ASN1_STRING_set(value, bytes.data(), static_cast<int>(bytes.size())) != 1) {
      GENERAL_NAME_free(name);
      ASN1_STRING_free(value);
      return OpenSslError("subjectAltName");
    }
    GENERAL_NAME_set0_value(name, alt.ip ? GEN_IPADD : GEN_DNS, value);
    sk_GENERAL_NAME_push(names.get(), name);
  }
  return names;
}

// ---------------------------------------------------------------------------------------------
// Certificates.

// What one certificate says about its subject.
struct CertSpec {
  std::string common_name;
  bool is_ca = false;
  std::vector<AltName> alt_names;
  const char* extended_key_usage = nullptr;  // "serverAuth", "clientAuth"; null for the CA
  absl::Duration validity;
};

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("EC P-256 key generation");
  return key;
}

absl::Status SetRandomSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return OpenSslError("RAND_bytes");
  bytes[0] &= 0x7f;  // positive, as RFC 5280 wants
  BIGNUM* number = BN_bin2bn(bytes, sizeof(bytes), nullptr);
  const bool set = number != nullptr && BN_to_ASN1_INTEGER(number, X509_get_serialNumber(cert));
  BN_free(number);
  return set ? absl::OkStatus() : OpenSslError("serial number");
}

// One extension from OpenSSL's configuration syntax; only for the fixed strings below.
absl::Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
  const bool added = extension != nullptr && X509_add_ext(cert, extension, -1) == 1;
  X509_EXTENSION_free(extension);
  return added ? absl::OkStatus() : OpenSslError(absl::StrCat("extension ", value));
}

absl::Status AddExtensions(X509* cert, X509* issuer, const CertSpec& spec) {
  GRADHUB_RETURN_IF_ERROR(
      AddExtension(cert, issuer, NID_basic_constraints,
                   spec.is_ca ? "critical,CA:TRUE,pathlen:0" : "critical,CA:FALSE"));
  GRADHUB_RETURN_IF_ERROR(
      AddExtension(cert, issuer, NID_key_usage,
                   spec.is_ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature"));
  GRADHUB_RETURN_IF_ERROR(AddExtension(cert, issuer, NID_subject_key_identifier, "hash"));
  if (!spec.is_ca) {
    GRADHUB_RETURN_IF_ERROR(
        AddExtension(cert, issuer, NID_authority_key_identifier, "keyid:always"));
    GRADHUB_RETURN_IF_ERROR(AddExtension(cert, issuer, NID_ext_key_usage, spec.extended_key_usage));
  }
  if (spec.alt_names.empty()) return absl::OkStatus();
  GRADHUB_ASSIGN_OR_RETURN(Names names, ToGeneralNames(spec.alt_names));
  if (X509_add1_ext_i2d(cert, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1) {
    return OpenSslError("subjectAltName");
  }
  return absl::OkStatus();
}

// A certificate of `spec` for `subject_key`, signed by `issuer_key`; self-signed when `issuer`
// is null.
absl::StatusOr<Cert> Issue(const CertSpec& spec, EVP_PKEY* subject_key, X509* issuer,
                           EVP_PKEY* issuer_key) {
  Cert cert(X509_new());
  if (cert == nullptr || X509_set_version(cert.get(), X509_VERSION_3) != 1) {
    return OpenSslError("X509_new");
  }
  GRADHUB_RETURN_IF_ERROR(SetRandomSerial(cert.get()));
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(spec.common_name.c_str()),
                                 -1, -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : subject) != 1) {
    return OpenSslError("subject name");
  }
  const long backdate = static_cast<long>(absl::ToInt64Seconds(kBackdate));
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -backdate) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                      static_cast<long>(absl::ToInt64Seconds(spec.validity))) == nullptr ||
      X509_set_pubkey(cert.get(), subject_key) != 1) {
    return OpenSslError("validity or public key");
  }
  GRADHUB_RETURN_IF_ERROR(AddExtensions(cert.get(), issuer ? issuer : cert.get(), spec));
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) <= 0) return OpenSslError("signing");
  return cert;
}

// ---------------------------------------------------------------------------------------------
// Files.

template <typename Write>
absl::StatusOr<std::string> ToPem(Write write) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || write(bio.get()) != 1) return OpenSslError("PEM encoding");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  return ToPem([cert](BIO* bio) { return PEM_write_bio_X509(bio, cert); });
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  return ToPem([key](BIO* bio) {
    return PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
}

// `text` into `path` with `mode`, through a temporary file renamed over it.
absl::Status WriteAtomically(const std::string& path, const std::string& text, mode_t mode) {
  const std::string temporary = path + ".tmp";
  std::remove(temporary.c_str());
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return absl::InternalError(absl::StrCat("tls: cannot create ", temporary));
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                       fchmod(fd, mode) == 0 && fsync(fd) == 0;
  close(fd);
  if (!written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::InternalError(absl::StrCat("tls: cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status WritePair(const std::string& cert_path, X509* cert, const std::string& key_path,
                       EVP_PKEY* key) {
  GRADHUB_ASSIGN_OR_RETURN(const std::string key_pem, KeyPem(key));
  GRADHUB_ASSIGN_OR_RETURN(const std::string cert_pem, CertPem(cert));
  GRADHUB_RETURN_IF_ERROR(WriteAtomically(key_path, key_pem, 0600));
  return WriteAtomically(cert_path, cert_pem, 0644);
}

absl::Status MakeDirectory(const std::string& dir, fs::perms mode) {
  std::error_code error;
  if (fs::is_directory(dir, error)) return absl::OkStatus();
  fs::create_directories(dir, error);
  if (!error) fs::permissions(dir, mode, error);
  if (error)
    return absl::InternalError(absl::StrCat("tls: cannot create ", dir, ": ", error.message()));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The CA.

struct Authority {
  Key key;
  Cert cert;
};

absl::StatusOr<Authority> LoadCa(const std::string& cert_path, const std::string& key_path) {
  Bio cert_bio(BIO_new_file(cert_path.c_str(), "r"));
  Bio key_bio(BIO_new_file(key_path.c_str(), "r"));
  Authority ca{
      Key(key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr),
      Cert(cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr)};
  if (ca.key == nullptr || ca.cert == nullptr ||
      X509_check_private_key(ca.cert.get(), ca.key.get()) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tls: the CA in ", cert_path, " and ", key_path,
        " cannot be read or do not match; remove both to make a new CA (then every client must "
        "trust the new ca.pem)"));
  }
  time_t must_last_until = absl::ToTimeT(absl::Now() + kMinRemainingValidity);
  if (X509_cmp_time(X509_get0_notAfter(ca.cert.get()), &must_last_until) <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("tls: the CA in ", cert_path, " expires within ",
                     absl::FormatDuration(kMinRemainingValidity), "; remove it and ", key_path,
                     " to make a new CA, then give every client the new ca.pem"));
  }
  return ca;
}

// Step 1: the kept CA, or a new one.
absl::StatusOr<Authority> KeptOrNewCa(const std::string& cert_path, const std::string& key_path,
                                      bool* made) {
  *made = !fs::exists(cert_path) && !fs::exists(key_path);
  if (!*made) return LoadCa(cert_path, key_path);
  GRADHUB_ASSIGN_OR_RETURN(Key key, NewKey());
  const CertSpec spec{kCaName, /*is_ca=*/true, {}, nullptr, kCaValidity};
  GRADHUB_ASSIGN_OR_RETURN(Cert cert, Issue(spec, key.get(), nullptr, key.get()));
  GRADHUB_RETURN_IF_ERROR(WritePair(cert_path, cert.get(), key_path, key.get()));
  return Authority{std::move(key), std::move(cert)};
}

absl::Status IssueLeaf(const Authority& ca, const CertSpec& spec, const std::string& cert_path,
                       const std::string& key_path) {
  GRADHUB_ASSIGN_OR_RETURN(Key key, NewKey());
  GRADHUB_ASSIGN_OR_RETURN(Cert cert, Issue(spec, key.get(), ca.cert.get(), ca.key.get()));
  return WritePair(cert_path, cert.get(), key_path, key.get());
}

// Step 3's names: the loopback ones and `hosts`, each once.
absl::StatusOr<std::vector<AltName>> ServerNames(const std::vector<std::string>& hosts) {
  std::vector<AltName> names;
  std::vector<std::string> seen;
  for (const std::string& host :
       {std::string("localhost"), std::string("127.0.0.1"), std::string("::1")}) {
    GRADHUB_ASSIGN_OR_RETURN(AltName name, ParseHost(host));
    names.push_back(std::move(name));
    seen.push_back(host);
  }
  for (const std::string& host : hosts) {
    if (std::find(seen.begin(), seen.end(), host) != seen.end()) continue;
    GRADHUB_ASSIGN_OR_RETURN(AltName name, ParseHost(host));
    names.push_back(std::move(name));
    seen.push_back(host);
  }
  return names;
}

}  // namespace

ClusterCertFiles::NodeFiles NodeCertFiles(const std::string& out_dir, const std::string& name) {
  return {out_dir + "/node-" + name + ".pem", out_dir + "/node-" + name + "-key.pem"};
}

absl::StatusOr<ClusterCertFiles> MakeClusterCerts(const ClusterCertsOptions& options) {
  // Every name is checked before a file is written.
  GRADHUB_ASSIGN_OR_RETURN(const std::vector<AltName> server_names, ServerNames(options.hosts));
  for (const std::string& node : options.nodes) GRADHUB_RETURN_IF_ERROR(CheckNodeName(node));
  const std::string ca_dir = options.ca_dir.empty() ? options.out_dir : options.ca_dir;
  GRADHUB_RETURN_IF_ERROR(MakeDirectory(options.out_dir, fs::perms(0755)));
  GRADHUB_RETURN_IF_ERROR(
      MakeDirectory(ca_dir, ca_dir == options.out_dir ? fs::perms(0755) : fs::perms(0700)));
  ClusterCertFiles files{options.out_dir + "/ca.pem",
                         ca_dir + "/ca-key.pem",
                         options.out_dir + "/server.pem",
                         options.out_dir + "/server-key.pem",
                         {},
                         false};
  const std::string kept_cert = ca_dir + "/ca.pem";
  GRADHUB_ASSIGN_OR_RETURN(const Authority ca,
                           KeptOrNewCa(kept_cert, files.ca_key, &files.made_ca));
  if (kept_cert != files.ca_cert) {  // step 2
    GRADHUB_ASSIGN_OR_RETURN(const std::string pem, CertPem(ca.cert.get()));
    GRADHUB_RETURN_IF_ERROR(WriteAtomically(files.ca_cert, pem, 0644));
  }
  GRADHUB_RETURN_IF_ERROR(IssueLeaf(ca,
                                    {kServerName, false, server_names, "serverAuth", kLeafValidity},
                                    files.server_cert, files.server_key));
  for (const std::string& node : options.nodes) {
    const ClusterCertFiles::NodeFiles paths = NodeCertFiles(options.out_dir, node);
    GRADHUB_RETURN_IF_ERROR(
        IssueLeaf(ca, {node, false, {AltName{false, node, ""}}, "clientAuth", kLeafValidity},
                  paths.cert, paths.key));
    files.nodes[node] = paths;
  }
  return files;
}

}  // namespace gradhub::tls
