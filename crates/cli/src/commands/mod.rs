pub mod bench;
pub mod convert;
pub mod gen_data;
pub mod inspect;
pub mod run;
pub mod score;
pub mod serve;
pub mod split;
pub mod tokenize;

/// The median of timings (the mean of the middle two for an even count).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
