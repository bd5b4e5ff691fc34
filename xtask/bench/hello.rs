use std::collections::BTreeMap;
use std::fmt::Display;

trait Shape {
    fn area(&self) -> f64;
    fn name(&self) -> String;
}
struct Square<T>(T);
struct Rect<T> {
    w: T,
    h: T,
}
impl<T: Into<f64> + Copy + Display> Shape for Square<T> {
    fn area(&self) -> f64 {
        let s: f64 = self.0.into();
        s * s
    }
    fn name(&self) -> String {
        format!("square({})", self.0)
    }
}
impl<T: Into<f64> + Copy + Display> Shape for Rect<T> {
    fn area(&self) -> f64 {
        self.w.into() * self.h.into()
    }
    fn name(&self) -> String {
        format!("rect({}x{})", self.w, self.h)
    }
}
fn largest<T: PartialOrd + Copy>(xs: &[T]) -> Option<T> {
    let mut it = xs.iter().copied();
    let mut m = it.next()?;
    for x in it {
        if x > m {
            m = x;
        }
    }
    Some(m)
}
fn main() {
    let shapes: Vec<Box<dyn Shape>> = vec![
        Box::new(Square(3u8)),
        Box::new(Rect { w: 2.5f32, h: 4.0 }),
        Box::new(Square(1.5f64)),
    ];
    let by_name: BTreeMap<String, f64> = shapes.iter().map(|s| (s.name(), s.area())).collect();
    for (k, v) in &by_name {
        println!("hello {k} = {v:.3}");
    }
    println!("largest {:?} {:?}", largest(&[3, 9, -2, 7]), largest(&['x', 'b', 'z']));
    let v: Vec<u64> = (1..=20u64).map(|i| i * i).filter(|x| x % 3 != 0).collect();
    println!("sum {} of {:?}", v.iter().sum::<u64>(), v);
}
