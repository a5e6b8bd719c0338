import { Card, Grid, type CardProps } from 'antd';

/**
 * A card whose controls (`extra`) sit in its header beside the title, except on a phone (narrower
 * than Ant Design's `sm`, 576 pixels): there they open its body, on a line of their own. In the
 * header they never shrink or wrap, and pushed the page wider than the screen.
 */
export function PageCard({ extra, children, ...props }: CardProps) {
  const { sm } = Grid.useBreakpoint();
  if (sm !== false || !extra) {
    return (
      <Card extra={extra} {...props}>
        {children}
      </Card>
    );
  }
  return (
    <Card {...props}>
      <div style={{ marginBottom: 16 }}>{extra}</div>
      {children}
    </Card>
  );
}
