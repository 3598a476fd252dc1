// Tests of the SVG pictures (filled in with the timeline and segments commands).
