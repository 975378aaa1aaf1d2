// HDF5 helpers of the io layer: error text from HDF5's stack, owning
// handles, and attribute readers/writers (see trident/io/h5util.hpp).
#include "trident/io/h5util.hpp"

#include <ctime>

namespace trident::h5 {

namespace {

struct StackText {
  std::string outer, inner;
};

herr_t collect_message(unsigned n, const H5E_error2_t* e, void* data) {
  auto* t = static_cast<StackText*>(data);
  std::string desc = e->desc ? e->desc : "";
  if (n == 0) t->outer = desc;
  t->inner = desc;
  return 0;
}

std::string attr_class_error(const std::string& name, const char* want) {
  return "attribute '" + name + "' is not " + want;
}

Handle open_attr(hid_t obj, const std::string& name) {
  QuietErrors quiet;
  return TRIDENT_H5_ATTR(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "open attribute '" + name + "'");
}

// Replaces an attribute: deleting first lets a value change type or size.
Handle create_attr(hid_t obj, const std::string& name, hid_t type, hid_t space) {
  htri_t exists = TRIDENT_H5(H5Aexists(obj, name.c_str()), "check attribute '" + name + "'");
  if (exists > 0) TRIDENT_H5(H5Adelete(obj, name.c_str()), "delete attribute '" + name + "'");
  return TRIDENT_H5_ATTR(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
                         "create attribute '" + name + "'");
}

Handle scalar_space() { return TRIDENT_H5_SPACE(H5Screate(H5S_SCALAR), "scalar dataspace"); }

Handle vector_space(size_t n) {
  hsize_t dims[1] = {static_cast<hsize_t>(n)};
  return TRIDENT_H5_SPACE(H5Screate_simple(1, dims, nullptr), "1-d dataspace");
}

hssize_t attr_points(hid_t attr) {
  Handle space = TRIDENT_H5_SPACE(H5Aget_space(attr), "attribute dataspace");
  return TRIDENT_H5(H5Sget_simple_extent_npoints(space), "attribute size");
}

}  // namespace

std::recursive_mutex& library_mutex() {
  static std::recursive_mutex m;
  return m;
}

std::string error_text() {
  StackText t;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_message, &t);
  if (t.outer.empty()) return "HDF5 call failed";
  if (t.inner.empty() || t.inner == t.outer) return t.outer;
  return t.outer + " (" + t.inner + ")";
}

QuietErrors::QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

QuietErrors::~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

void fail(const char* file, int line, const std::string& what) {
  const std::string text = error_text();
  H5Eclear2(H5E_DEFAULT);
  throw Failure(source_place(file, line) + ": " + what + ": " + text, what, text);
}

static Handle checked(hid_t id, Handle::Closer close, const char* file, int line,
                      const std::string& what) {
  if (id < 0) fail(file, line, what);
  return Handle(id, close);
}

Handle group(hid_t id, const char* f, int l, const std::string& w) {
  return checked(id, H5Gclose, f, l, w);
}
Handle dataset(hid_t id, const char* f, int l, const std::string& w) {
  return checked(id, H5Dclose, f, l, w);
}
Handle dataspace(hid_t id, const char* f, int l, const std::string& w) {
  return checked(id, H5Sclose, f, l, w);
}
Handle datatype(hid_t id, const char* f, int l, const std::string& w) {
  return checked(id, H5Tclose, f, l, w);
}
Handle plist(hid_t id, const char* f, int l, const std::string& w) {
  return checked(id, H5Pclose, f, l, w);
}
Handle attribute(hid_t id, const char* f, int l, const std::string& w) {
  return checked(id, H5Aclose, f, l, w);
}

Handle vlen_string_type() {
  Handle t = TRIDENT_H5_TYPE(H5Tcopy(H5T_C_S1), "copy string type");
  TRIDENT_H5(H5Tset_size(t, H5T_VARIABLE), "variable-length string type");
  TRIDENT_H5(H5Tset_cset(t, H5T_CSET_UTF8), "UTF-8 string type");
  return t;
}

Handle fixed_string_type(size_t n) {
  Handle t = TRIDENT_H5_TYPE(H5Tcopy(H5T_C_S1), "copy string type");
  TRIDENT_H5(H5Tset_size(t, n), "fixed string type");
  TRIDENT_H5(H5Tset_strpad(t, H5T_STR_NULLTERM), "fixed string padding");
  return t;
}

Handle open_or_create_group(hid_t loc, const std::string& name) {
  htri_t exists = TRIDENT_H5(H5Lexists(loc, name.c_str(), H5P_DEFAULT), "look up group " + name);
  if (exists > 0)
    return TRIDENT_H5_GROUP(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), "open group " + name);
  return TRIDENT_H5_GROUP(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                          "create group " + name);
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle type = vlen_string_type();
  Handle space = scalar_space();
  Handle a = create_attr(obj, name, type, space);
  const char* p = value.c_str();
  TRIDENT_H5(H5Awrite(a, type, &p), "write attribute '" + name + "'");
}

void write_attr(hid_t obj, const std::string& name, const char* value) {
  write_attr(obj, name, std::string(value));
}

void write_attr(hid_t obj, const std::string& name, int64_t value) {
  Handle space = scalar_space();
  Handle a = create_attr(obj, name, H5T_STD_I64LE, space);
  TRIDENT_H5(H5Awrite(a, H5T_NATIVE_INT64, &value), "write attribute '" + name + "'");
}

void write_attr(hid_t obj, const std::string& name, double value) {
  Handle space = scalar_space();
  Handle a = create_attr(obj, name, H5T_IEEE_F64LE, space);
  TRIDENT_H5(H5Awrite(a, H5T_NATIVE_DOUBLE, &value), "write attribute '" + name + "'");
}

void write_attr(hid_t obj, const std::string& name, const std::vector<std::string>& values) {
  Handle type = vlen_string_type();
  Handle space = vector_space(values.size());
  Handle a = create_attr(obj, name, type, space);
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  if (!values.empty()) TRIDENT_H5(H5Awrite(a, type, ptrs.data()), "write attribute '" + name + "'");
}

void write_attr(hid_t obj, const std::string& name, const std::vector<int64_t>& values) {
  Handle space = vector_space(values.size());
  Handle a = create_attr(obj, name, H5T_STD_I64LE, space);
  if (!values.empty())
    TRIDENT_H5(H5Awrite(a, H5T_NATIVE_INT64, values.data()), "write attribute '" + name + "'");
}

std::string read_string_attr(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle ftype = TRIDENT_H5_TYPE(H5Aget_type(a), "attribute type");
  if (H5Tget_class(ftype) != H5T_STRING) throw Error(attr_class_error(name, "a string"));
  if (attr_points(a) != 1) throw Error(attr_class_error(name, "a scalar"));
  if (H5Tis_variable_str(ftype) > 0) {
    Handle mtype = vlen_string_type();
    char* p = nullptr;
    TRIDENT_H5(H5Aread(a, mtype, &p), "read attribute '" + name + "'");
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(ftype);
  Handle mtype = fixed_string_type(n + 1);
  std::string buf(n + 1, '\0');
  TRIDENT_H5(H5Aread(a, mtype, buf.data()), "read attribute '" + name + "'");
  return std::string(buf.c_str());
}

int64_t read_int_attr(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle ftype = TRIDENT_H5_TYPE(H5Aget_type(a), "attribute type");
  if (H5Tget_class(ftype) != H5T_INTEGER) throw Error(attr_class_error(name, "an integer"));
  if (attr_points(a) != 1) throw Error(attr_class_error(name, "a scalar"));
  int64_t v = 0;
  TRIDENT_H5(H5Aread(a, H5T_NATIVE_INT64, &v), "read attribute '" + name + "'");
  return v;
}

double read_double_attr(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle ftype = TRIDENT_H5_TYPE(H5Aget_type(a), "attribute type");
  if (H5Tget_class(ftype) != H5T_FLOAT) throw Error(attr_class_error(name, "a float"));
  if (attr_points(a) != 1) throw Error(attr_class_error(name, "a scalar"));
  double v = 0;
  TRIDENT_H5(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "read attribute '" + name + "'");
  return v;
}

std::vector<std::string> read_string_list_attr(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle ftype = TRIDENT_H5_TYPE(H5Aget_type(a), "attribute type");
  if (H5Tget_class(ftype) != H5T_STRING || H5Tis_variable_str(ftype) <= 0)
    throw Error(attr_class_error(name, "a list of variable-length strings"));
  size_t n = static_cast<size_t>(attr_points(a));
  std::vector<char*> ptrs(n, nullptr);
  Handle mtype = vlen_string_type();
  if (n) TRIDENT_H5(H5Aread(a, mtype, ptrs.data()), "read attribute '" + name + "'");
  std::vector<std::string> out;
  for (char* p : ptrs) {
    out.emplace_back(p ? p : "");
    H5free_memory(p);
  }
  return out;
}

std::vector<int64_t> read_int_list_attr(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle ftype = TRIDENT_H5_TYPE(H5Aget_type(a), "attribute type");
  if (H5Tget_class(ftype) != H5T_INTEGER) throw Error(attr_class_error(name, "integers"));
  std::vector<int64_t> v(static_cast<size_t>(attr_points(a)));
  if (!v.empty())
    TRIDENT_H5(H5Aread(a, H5T_NATIVE_INT64, v.data()), "read attribute '" + name + "'");
  return v;
}

std::string utc_iso8601_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace trident::h5
