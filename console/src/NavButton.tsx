import { Button, type ButtonProps } from 'antd';
import { useNavigate } from 'react-router-dom';

/**
 * A button that opens another page of the console. Not a Link around a Button: that is a control
 * inside a control (invalid HTML, and two tab stops, the link's and the button's, for one action).
 */
export function NavButton({ to, ...props }: Omit<ButtonProps, 'onClick' | 'href'> & { to: string }) {
  const navigate = useNavigate();
  return <Button {...props} onClick={() => navigate(to)} />;
}
