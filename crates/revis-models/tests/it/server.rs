//! A tiny HTTP/1.1 file server on 127.0.0.1 for the pull tests: fixed routes, Range support,
//! redirects, scripted faults, and a record of each request's Range and Authorization.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub path: String,
    /// The `Range` header, if the request had one.
    pub range: Option<String>,
    pub status: u16,
    /// The `Authorization` header, if the request had one.
    pub auth: Option<String>,
}

#[derive(Default)]
struct Route {
    body: Vec<u8>,
    /// Answer Range requests with the whole body (status 200).
    ignore_range: bool,
    /// Send only this many body bytes of the next response, then drop the connection.
    cut_next: Option<usize>,
    /// Send no Content-Length: the body ends when the connection closes.
    no_length: bool,
    /// Answer 302 with this Location instead.
    redirect: Option<String>,
    /// Extra header lines (`Name: value\r\n`) of every response.
    headers: String,
}

#[derive(Default)]
struct State {
    routes: HashMap<String, Route>,
    hits: Vec<Hit>,
}

/// The server; it stops (and surfaces a panic of its thread) when dropped.
pub struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    serve(stream.expect("accept"), &state);
                }
            })
        };
        Server { addr, state, stop, thread: Some(thread) }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Serves `body` at `path`.
    pub fn route(&self, path: &str, body: impl Into<Vec<u8>>) {
        let route = Route { body: body.into(), ..Route::default() };
        self.state.lock().unwrap().routes.insert(path.to_owned(), route);
    }

    /// `path` answers 302 to `location`.
    pub fn redirect(&self, path: &str, location: &str) {
        let route = Route { redirect: Some(location.to_owned()), ..Route::default() };
        self.state.lock().unwrap().routes.insert(path.to_owned(), route);
    }

    /// `path` answers with one more header line.
    pub fn header(&self, path: &str, name: &str, value: &str) {
        self.with_route(path, |r| r.headers.push_str(&format!("{name}: {value}\r\n")));
    }

    /// The next response for `path` stops after `after` body bytes and the connection is dropped.
    pub fn cut_next(&self, path: &str, after: usize) {
        self.with_route(path, |r| r.cut_next = Some(after));
    }

    /// `path` answers without a Content-Length (the client learns the size only by reading).
    pub fn no_length(&self, path: &str) {
        self.with_route(path, |r| r.no_length = true);
    }

    /// `path` answers every Range request with the whole body.
    pub fn ignore_range(&self, path: &str) {
        self.with_route(path, |r| r.ignore_range = true);
    }

    /// The length of the body served at `path`.
    pub fn body_len(&self, path: &str) -> usize {
        self.state.lock().unwrap().routes[path].body.len()
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.state.lock().unwrap().hits.clone()
    }

    /// Forgets the requests seen so far.
    pub fn clear_hits(&self) {
        self.state.lock().unwrap().hits.clear();
    }

    fn with_route(&self, path: &str, f: impl FnOnce(&mut Route)) {
        f(self.state.lock().unwrap().routes.get_mut(path).expect("route exists"));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
            && !std::thread::panicking()
        {
            panic!("test server thread panicked");
        }
    }
}

fn serve(mut stream: TcpStream, state: &Mutex<State>) {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return, // the wake-up connection, or a client that went away
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.split("\r\n");
    let path = lines.next().and_then(|l| l.split(' ').nth(1)).unwrap_or("/").to_owned();
    let fields: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(':')).collect();
    let field = |wanted: &str| fields.iter().find(|(name, _)| name.trim().eq_ignore_ascii_case(wanted)).map(|(_, v)| v.trim().to_owned());
    let (range, auth) = (field("range"), field("authorization"));

    let mut state = state.lock().unwrap();
    let mut send_length = true;
    let (status, headers, body, cut) = match state.routes.get_mut(&path) {
        None => (404, String::new(), b"not found".to_vec(), None),
        Some(Route { redirect: Some(location), .. }) => (302, format!("Location: {location}\r\n"), Vec::new(), None),
        Some(route) => {
            send_length = !route.no_length;
            let len = route.body.len();
            let start = range
                .as_deref()
                .filter(|_| !route.ignore_range)
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .map(|n| n.parse::<usize>().expect("open-ended byte range"));
            let cut = route.cut_next.take();
            let extra = route.headers.clone();
            match start {
                Some(start) if start >= len => (416, format!("Content-Range: bytes */{len}\r\n{extra}"), Vec::new(), None),
                Some(start) => {
                    (206, format!("Content-Range: bytes {start}-{}/{len}\r\n{extra}", len - 1), route.body[start..].to_vec(), cut)
                }
                None => (200, extra, route.body.clone(), cut),
            }
        }
    };
    state.hits.push(Hit { path, range, status, auth });
    drop(state);

    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        404 => "Not Found",
        _ => "Range Not Satisfiable",
    };
    let length = if send_length { format!("Content-Length: {}\r\n", body.len()) } else { String::new() };
    let head = format!("HTTP/1.1 {status} {reason}\r\n{length}{headers}Connection: close\r\n\r\n");
    let sent = cut.unwrap_or(body.len()).min(body.len());
    // The client may hang up early (for instance on a failed check); that is not the server's failure.
    let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body[..sent]));
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Both);
}
