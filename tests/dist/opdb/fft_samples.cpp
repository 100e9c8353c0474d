// Samples for the FFT kernels, through torch.fft's functions: real and complex inputs (complex ones made
// from a trailing pair dim), transforms along a sharded-elsewhere dim, and the inverse real transform.
// Complex results are compared (and differentiated) as their real and imaginary parts.

#include "../op_db.h"

namespace dtensor::testing {
namespace {

using In = const std::vector<at::Tensor>&;

at::Tensor real_parts(const at::Tensor& complex) { return at::view_as_real(complex); }

const bool fft_samples_registered = add_op_samples({
    {.name = "fft_r2c_full", .shapes = {{5, 8}}, .run = [](In x) { return outputs(real_parts(at::fft_fft(x[0]))); }, .two_d = true},
    {.name = "fft_r2c_onesided", .shapes = {{5, 8}}, .run = [](In x) { return outputs(real_parts(at::fft_rfft(x[0], {}, 0))); }},
    {.name = "fft_c2c", .shapes = {{5, 6, 2}},
     .run = [](In x) { return outputs(real_parts(at::fft_ifft(at::view_as_complex(x[0].contiguous()), {}, 1, "ortho"))); }},
    {.name = "fft_c2r", .shapes = {{5, 5, 2}},
     .run = [](In x) { return outputs(at::fft_irfft(at::view_as_complex(x[0].contiguous()), 8, 1)); }},
});

}  // namespace
}  // namespace dtensor::testing
