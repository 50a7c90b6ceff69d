// The kernel functions of the ops that other ops are composed of (norm_linear.cc of the linear and
// elementwise ops; linear_norm_linear.cc of the linears, the all-reduce and norm_linear.cc's),
// declared once.  Each is defined by its own op's translation unit.
#pragma once

#include <vector>

#include "paddle/extension.h"

// elementwise.cc
std::vector<paddle::Tensor> AddRmsNormForward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                              const paddle::Tensor& w, float eps);
std::vector<paddle::Tensor> SwigluForward(const paddle::Tensor& x);
// linear.cc, linear_half.cc, linear_quant.cc
std::vector<paddle::Tensor> LinearForward(const paddle::Tensor& x, const paddle::Tensor& w);
std::vector<paddle::Tensor> LinearBf16Forward(const paddle::Tensor& x, const paddle::Tensor& w);
std::vector<paddle::Tensor> LinearF16Forward(const paddle::Tensor& x, const paddle::Tensor& w);
std::vector<paddle::Tensor> LinearPanelsForward(const paddle::Tensor& x, const paddle::Tensor& w);
std::vector<paddle::Tensor> LinearInt8Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale);
std::vector<paddle::Tensor> LinearInt4Forward(const paddle::Tensor& x, const paddle::Tensor& q,
                                              const paddle::Tensor& scale);
// collective.cc
std::vector<paddle::Tensor> AllReduceForward(const paddle::Tensor& x);
// norm_linear.cc
std::vector<paddle::Tensor> NormLinearForward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                              const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                              bool swiglu);
std::vector<paddle::Tensor> NormLinearPanelsForward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                    const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                                    bool swiglu);
std::vector<paddle::Tensor> NormLinearBf16Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                  const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                                  bool swiglu);
std::vector<paddle::Tensor> NormLinearF16Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                 const paddle::Tensor& norm_w, const paddle::Tensor& w, float eps,
                                                 bool swiglu);
std::vector<paddle::Tensor> NormLinearInt8Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                  const paddle::Tensor& norm_w, const paddle::Tensor& q,
                                                  const paddle::Tensor& scale, float eps, bool swiglu);
std::vector<paddle::Tensor> NormLinearInt4Forward(const paddle::Tensor& h, const paddle::Tensor& delta,
                                                  const paddle::Tensor& norm_w, const paddle::Tensor& q,
                                                  const paddle::Tensor& scale, float eps, bool swiglu);
