// Shape: a tensor's sizes (or strides) as a small vector of int64, with the helpers every op
// needs: element count, contiguous strides, dimension wrapping and broadcasting.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace mg {

using Shape = std::vector<int64_t>;

int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& sizes);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
std::string shape_str(const Shape& s);  // "(2, 3, 4)"

}  // namespace mg

namespace std {
// Lets MG_CHECK messages stream shapes directly: MG_CHECK(..., "got ", x.shape()).
inline ostream& operator<<(ostream& os, const vector<int64_t>& s) { return os << mg::shape_str(s); }
}  // namespace std
