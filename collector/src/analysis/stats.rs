//! The statistics behind the leak and fragmentation rules (docs/detection.md):
//! Mann-Kendall for "is it rising", Theil-Sen for "how fast", with Sen's confidence interval.
//! Inputs are one sample per epoch, at most a few dozen, so the O(n²) forms are used as is.

/// Result of a one-sided Mann-Kendall test for an upward trend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MannKendall {
    pub n: usize,
    /// Σ sgn(x_j − x_i) over i < j.
    pub s: i64,
    /// Var(S) with the tie correction.
    pub var: f64,
    pub z: f64,
    /// One-sided p-value for "increasing".
    pub p: f64,
}

pub fn mann_kendall(x: &[f64]) -> MannKendall {
    let n = x.len();
    let mut s: i64 = 0;
    for i in 0..n {
        for j in i + 1..n {
            s += sign(x[j] - x[i]);
        }
    }
    // Tie groups: sort a copy and count runs of equal values.
    let mut sorted = x.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mut ties = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && sorted[j] == sorted[i] {
            j += 1;
        }
        let t = (j - i) as f64;
        if t > 1.0 {
            ties += t * (t - 1.0) * (2.0 * t + 5.0);
        }
        i = j;
    }
    let nf = n as f64;
    let var = ((nf * (nf - 1.0) * (2.0 * nf + 5.0)) - ties) / 18.0;
    let z = if var <= 0.0 {
        0.0
    } else if s > 0 {
        (s as f64 - 1.0) / var.sqrt()
    } else if s < 0 {
        (s as f64 + 1.0) / var.sqrt()
    } else {
        0.0
    };
    MannKendall {
        n,
        s,
        var,
        z,
        p: 1.0 - normal_cdf(z),
    }
}

fn sign(d: f64) -> i64 {
    if d > 0.0 {
        1
    } else if d < 0.0 {
        -1
    } else {
        0
    }
}

/// Theil-Sen slope (units per sample) with Sen's two-sided confidence interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TheilSen {
    pub slope: f64,
    pub low: f64,
    pub high: f64,
}

/// `confidence` is two-sided, e.g. 0.95. `mk_var` is Var(S) of the same samples.
pub fn theil_sen(x: &[f64], mk_var: f64, confidence: f64) -> Option<TheilSen> {
    let n = x.len();
    if n < 2 {
        return None;
    }
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            slopes.push((x[j] - x[i]) / (j - i) as f64);
        }
    }
    slopes.sort_by(|a, b| a.total_cmp(b));
    let m = slopes.len();
    let slope = if m % 2 == 1 {
        slopes[m / 2]
    } else {
        (slopes[m / 2 - 1] + slopes[m / 2]) / 2.0
    };
    // Sen (1968), Gilbert (1987): ranks M1 = (N − C)/2 and M2 + 1 = (N + C)/2 + 1, 1-based.
    let c = normal_quantile(0.5 + confidence / 2.0) * mk_var.max(0.0).sqrt();
    let nf = m as f64;
    let lo_rank = ((nf - c) / 2.0).floor().max(1.0) as usize;
    let hi_rank = ((nf + c) / 2.0).ceil() as usize + 1;
    let at = |rank: usize| slopes[rank.clamp(1, m) - 1];
    Some(TheilSen {
        slope,
        low: at(lo_rank),
        high: at(hi_rank),
    })
}

/// Φ(z), the standard normal CDF (Abramowitz & Stegun 7.1.26 on erf; error < 1.5e-7).
pub fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    if z >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

/// Φ⁻¹(p) by bisection on `normal_cdf`: called a few times per epoch, exactness matters more.
pub fn normal_quantile(p: f64) -> f64 {
    let (mut lo, mut hi) = (-10.0f64, 10.0f64);
    for _ in 0..80 {
        let mid = (lo + hi) / 2.0;
        if normal_cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// Median of a small set (0 when empty).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len();
    if m % 2 == 1 {
        v[m / 2]
    } else {
        (v[m / 2 - 1] + v[m / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_series_match_the_exact_small_sample_floor() {
        // Exact small-sample critical values: Z = 2.20 / 2.63 / 3.00 for n = 5 / 6 / 7.
        for (n, z) in [(5, 2.20), (6, 2.63), (7, 3.00)] {
            let x: Vec<f64> = (0..n).map(f64::from).collect();
            let mk = mann_kendall(&x);
            assert_eq!(mk.s, i64::from(n * (n - 1) / 2));
            assert!((mk.z - z).abs() < 0.01, "n={n}: z={}", mk.z);
        }
    }

    #[test]
    fn flat_and_falling_series_show_no_upward_trend() {
        let flat = mann_kendall(&[5.0; 10]);
        assert_eq!((flat.s, flat.z), (0, 0.0));
        assert!(flat.p > 0.49);
        let down: Vec<f64> = (0..10).rev().map(f64::from).collect();
        assert!(mann_kendall(&down).p > 0.99);
    }

    #[test]
    fn ties_shrink_the_variance() {
        // One step up, then flat: S is large but the ties reduce Var(S).
        let x = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0];
        let mk = mann_kendall(&x);
        assert_eq!(mk.s, 16);
        assert!((mk.var - 48.0).abs() < 1e-9);
    }

    #[test]
    fn theil_sen_ignores_an_outlier() {
        let mut x: Vec<f64> = (0..12).map(|i| 3.0 * f64::from(i)).collect();
        x[5] = 1000.0;
        let mk = mann_kendall(&x);
        let ts = theil_sen(&x, mk.var, 0.95).unwrap();
        assert!((ts.slope - 3.0).abs() < 1e-9);
        assert!(ts.low <= 3.0 && ts.high >= 3.0);
    }

    #[test]
    fn normal_functions_agree() {
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
        assert!((normal_quantile(0.975) - 1.96).abs() < 1e-3);
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-9);
    }
}
