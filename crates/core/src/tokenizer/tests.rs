use super::*;

#[test]
fn clean_spaces_pass() {
    assert_eq!(clean_spaces(b"a , b ' c it 's"), b"a, b'c it's".to_vec());
}
