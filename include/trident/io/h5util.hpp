// Small HDF5 helpers shared by the io layer (run file, bench file,
// checkpoints): owning handles, one error-check macro that reports the
// library's own message, and attribute writers with the types h5py reads as
// Python values (variable-length UTF-8 strings, int64, float64).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/error.hpp"

namespace trident::h5 {

// HDF5 1.10 as Debian builds it (parallel, without --enable-threadsafe) must
// not be entered by two threads at once, and a background checkpoint writer
// runs beside the run file's appends: every HDF5 call of the process is made
// while holding this lock (recursive: io functions call each other).
std::recursive_mutex& library_mutex();
using Lock = std::lock_guard<std::recursive_mutex>;

// The innermost message of HDF5's current error stack ("" if empty): the
// part that says what went wrong (e.g. "unable to open file").
std::string error_text();

// Suppresses HDF5's automatic printing of its error stack while alive; our
// exceptions carry the message instead. Restores the previous handler.
class QuietErrors {
 public:
  QuietErrors();
  ~QuietErrors();
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// An owning hid_t; the close function matches the kind of object.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  // Gives up ownership (the caller closes, e.g. to check H5Fclose's result).
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

// An HDF5 call failed: what was being done ("write /events") and HDF5's
// own text kept apart, so that a layer that knows the file can say it in
// its own words (the run file adds the system's reason).
struct Failure : Error {
  Failure(const std::string& msg, std::string done_, std::string library_text_)
      : Error(msg), done(std::move(done_)), library_text(std::move(library_text_)) {}
  std::string done, library_text;
};

// Throws Failure "file:line: what: <HDF5 message>".
[[noreturn]] void fail(const char* file, int line, const std::string& what);

// Checks any HDF5 call that returns a negative value on failure.
#define TRIDENT_H5(expr, what)                                               \
  ([&]() {                                                                   \
    auto trident_h5_rc_ = (expr);                                            \
    if (trident_h5_rc_ < 0) ::trident::h5::fail(__FILE__, __LINE__, (what)); \
    return trident_h5_rc_;                                                   \
  }())

// Wrap a freshly created id into a Handle after checking it.
Handle group(hid_t id, const char* file, int line, const std::string& what);
Handle dataset(hid_t id, const char* file, int line, const std::string& what);
Handle dataspace(hid_t id, const char* file, int line, const std::string& what);
Handle datatype(hid_t id, const char* file, int line, const std::string& what);
Handle plist(hid_t id, const char* file, int line, const std::string& what);
Handle attribute(hid_t id, const char* file, int line, const std::string& what);
#define TRIDENT_H5_GROUP(expr, what) ::trident::h5::group((expr), __FILE__, __LINE__, (what))
#define TRIDENT_H5_DSET(expr, what) ::trident::h5::dataset((expr), __FILE__, __LINE__, (what))
#define TRIDENT_H5_SPACE(expr, what) ::trident::h5::dataspace((expr), __FILE__, __LINE__, (what))
#define TRIDENT_H5_TYPE(expr, what) ::trident::h5::datatype((expr), __FILE__, __LINE__, (what))
#define TRIDENT_H5_PLIST(expr, what) ::trident::h5::plist((expr), __FILE__, __LINE__, (what))
#define TRIDENT_H5_ATTR(expr, what) ::trident::h5::attribute((expr), __FILE__, __LINE__, (what))

// Variable-length UTF-8 string type (h5py reads it as str).
Handle vlen_string_type();
// Fixed-length, NUL-terminated string of n bytes (h5py: numpy "S<n>").
Handle fixed_string_type(size_t n);

// Opens `name` under loc, creating it if it does not exist. In a parallel
// file every rank must call it with the same name (collective metadata).
Handle open_or_create_group(hid_t loc, const std::string& name);

// Attribute writers; an existing attribute of that name is replaced. In a
// parallel file every rank must call them with identical values.
void write_attr(hid_t obj, const std::string& name, const std::string& value);
void write_attr(hid_t obj, const std::string& name, const char* value);
void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
void write_attr(hid_t obj, const std::string& name, const std::vector<std::string>& values);
void write_attr(hid_t obj, const std::string& name, const std::vector<int64_t>& values);

// Attribute readers (tests, checkpoints); throw trident::Error if missing or
// of another class.
std::string read_string_attr(hid_t obj, const std::string& name);
int64_t read_int_attr(hid_t obj, const std::string& name);
double read_double_attr(hid_t obj, const std::string& name);
std::vector<std::string> read_string_list_attr(hid_t obj, const std::string& name);
std::vector<int64_t> read_int_list_attr(hid_t obj, const std::string& name);

// "2026-11-29T08:10:00Z" for now (UTC, second resolution).
std::string utc_iso8601_now();

}  // namespace trident::h5
