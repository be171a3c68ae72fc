//! CPython 3.11's `random.Random`, as far as WebShop uses it: MT19937, `seed(int)` (through
//! `init_by_array` over the 32-bit words of `|seed|`), `random()`, `getrandbits(k <= 32)`,
//! `_randbelow` (rejection on `getrandbits(n.bit_length())`), `uniform`, `sample`, `shuffle` and
//! `choices` without weights. The goal list, its prices and its order depend on these draws, so
//! they must match CPython bit for bit (checked against values printed by CPython in the tests).

const N: usize = 624;
const M: usize = 397;

/// CPython's `random.Random` state.
#[derive(Clone)]
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyRandom {{ index: {} }}", self.index)
    }
}

impl PyRandom {
    /// `random.Random(seed)` / `random.seed(seed)` for an int seed.
    pub fn new(seed: i128) -> Self {
        let mut r = PyRandom { mt: [0; N], index: N };
        r.seed(seed);
        r
    }

    /// `random.seed(seed)` for an int: the key is `|seed|` split into 32-bit words, least
    /// significant first (one zero word for 0).
    pub fn seed(&mut self, seed: i128) {
        let mut n = seed.unsigned_abs();
        let mut key = Vec::new();
        if n == 0 {
            key.push(0u32);
        }
        while n > 0 {
            key.push(n as u32);
            n >>= 32;
        }
        self.init_by_array(&key);
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1812433253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19650218);
        let mut i = 1usize;
        let mut j = 0usize;
        let klen = key.len();
        let mut k = N.max(klen);
        while k > 0 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1664525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
            if j >= klen {
                j = 0;
            }
            k -= 1;
        }
        k = N - 1;
        while k > 0 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1566083941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
            k -= 1;
        }
        self.mt[0] = 0x8000_0000;
        self.index = N;
    }

    fn generate(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        for kk in 0..N {
            let y = (self.mt[kk] & UPPER) | (self.mt[(kk + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            self.mt[kk] = self.mt[(kk + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// `genrand_uint32`.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.generate();
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }

    /// `random.random()`: 53 random bits in [0, 1).
    pub fn random(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)
    }

    /// `random.getrandbits(k)` for `k <= 64`.
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        if k == 0 {
            return 0;
        }
        if k <= 32 {
            return (self.next_u32() >> (32 - k)) as u64;
        }
        // CPython fills 32-bit words least significant first; the last word keeps its top bits.
        let lo = self.next_u32() as u64;
        let hi = (self.next_u32() >> (64 - k)) as u64;
        lo | (hi << 32)
    }

    /// `random._randbelow(n)` (`_randbelow_with_getrandbits`), `n >= 1`.
    pub fn randbelow(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let k = 64 - n.leading_zeros();
        let mut r = self.getrandbits(k);
        while r >= n {
            r = self.getrandbits(k);
        }
        r
    }

    /// `random.uniform(a, b)`: `a + (b - a) * random()`.
    pub fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }

    /// `random.shuffle(x)`.
    pub fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            let j = self.randbelow(i as u64 + 1) as usize;
            x.swap(i, j);
        }
    }

    /// The indices `random.sample(range(n), k)` picks, in order (CPython 3.11's two strategies:
    /// a shrinking pool for small populations, rejection on a set otherwise). `k <= n`.
    pub fn sample_indices(&mut self, n: usize, k: usize) -> Vec<usize> {
        assert!(k <= n, "sample larger than population");
        let mut setsize = 21usize;
        if k > 5 {
            let e = ((k * 3) as f64).ln() / 4f64.ln();
            setsize += 4usize.pow(e.ceil() as u32);
        }
        let mut out = Vec::with_capacity(k);
        if n <= setsize {
            let mut pool: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = self.randbelow((n - i) as u64) as usize;
                out.push(pool[j]);
                pool[j] = pool[n - i - 1];
            }
        } else {
            let mut selected = std::collections::HashSet::with_capacity(k);
            for _ in 0..k {
                let mut j = self.randbelow(n as u64) as usize;
                while selected.contains(&j) {
                    j = self.randbelow(n as u64) as usize;
                }
                selected.insert(j);
                out.push(j);
            }
        }
        out
    }

    /// `random.choices(range(n), k=k)` without weights: `floor(random() * n)` each.
    pub fn choices_indices(&mut self, n: usize, k: usize) -> Vec<usize> {
        (0..k).map(|_| (self.random() * n as f64).floor() as usize).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Expected values printed by CPython 3.11:
    // python3 -c 'import random; random.seed(0); print([random.random() for _ in range(3)])'
    #[test]
    fn random_matches_cpython() {
        let mut r = PyRandom::new(0);
        assert_eq!(
            [r.random(), r.random(), r.random()],
            [0.8444218515250481, 0.7579544029403025, 0.420571580830845]
        );
        let mut r = PyRandom::new(233);
        assert_eq!(r.random(), 0.6824769139473528_f64);
        // seeds above 2**32 use a two-word key: random.seed(2**40 + 5); random.random()
        let mut r = PyRandom::new((1i128 << 40) + 5);
        assert_eq!(r.random(), 0.5043802970418443_f64);
        // negative seeds use |seed|
        assert_eq!(PyRandom::new(-7).random(), PyRandom::new(7).random());
    }

    // random.seed(1); x = list(range(10)); random.shuffle(x); print(x)
    // random.seed(2); print(random.sample(range(4), 2), random.sample(range(1000), 5), random.sample(range(1000), 50)[:5])
    // random.seed(3); print(random.uniform(10.0, 20.0), random.getrandbits(7), random.choices(range(26), k=4))
    #[test]
    fn shuffle_sample_uniform_match_cpython() {
        let mut r = PyRandom::new(1);
        let mut x: Vec<usize> = (0..10).collect();
        r.shuffle(&mut x);
        assert_eq!(x, vec![6, 8, 9, 7, 5, 3, 0, 4, 1, 2]);
        let mut r = PyRandom::new(2);
        assert_eq!(r.sample_indices(4, 2), vec![0, 3]);
        assert_eq!(r.sample_indices(1000, 5), vec![86, 369, 855, 173, 753]);
        assert_eq!(&r.sample_indices(1000, 50)[..5], &[828, 685, 874, 315, 257]);
        let mut r = PyRandom::new(3);
        assert_eq!(r.uniform(10.0, 20.0), 12.379646270918913);
        assert_eq!(r.getrandbits(7), 69);
        assert_eq!(r.choices_indices(26, 4), vec![3, 23, 12, 15]);
    }

    proptest! {
        #[test]
        fn randbelow_in_range(seed in 0i128..1_000_000, n in 1u64..1_000_000) {
            let mut r = PyRandom::new(seed);
            prop_assert!(r.randbelow(n) < n);
        }

        #[test]
        fn sample_is_distinct(seed in 0i128..1000, n in 1usize..400, kf in 0.0f64..1.0) {
            let k = ((n as f64) * kf) as usize;
            let mut r = PyRandom::new(seed);
            let s = r.sample_indices(n, k);
            let set: std::collections::HashSet<_> = s.iter().collect();
            prop_assert_eq!(set.len(), k);
            prop_assert!(s.iter().all(|&i| i < n));
        }
    }
}
