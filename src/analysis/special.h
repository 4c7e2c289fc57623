#pragma once
// Distribution tails for the p-values of the analyses, through Eigen's special functions
// (unsupported/Eigen/SpecialFunctions: the regularized incomplete beta `betainc` and the
// regularized upper incomplete gamma `igammac`, both Cephes-derived, double precision).
//
//   Student t, two-sided:   P(|T| >= |t|) = I_{df/(df+t^2)}(df/2, 1/2)
//   F upper tail:           P(F' >= F)    = I_{d2/(d2+d1 F)}(d2/2, d1/2)
//   chi-square upper tail:  P(X >= x)     = Q(k/2, x/2)
// Each returns NaN for arguments outside its domain (df <= 0, NaN input).
namespace scalelab::analysis {

double betainc(double a, double b, double x);  // I_x(a, b)
double t_two_sided_p(double t, double df);
double f_upper_p(double f, double d1, double d2);
double chi2_upper_p(double x, double k);
// The t quantile: q with P(T <= q) = prob, 0 < prob < 1 (bisection on the CDF to 1e-14; the
// CDF is monotone, so bisection cannot miss; a closed form does not exist).
double t_quantile(double prob, double df);

}  // namespace scalelab::analysis
